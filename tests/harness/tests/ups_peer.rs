//! The UPS peer (homelab_harness::power_peers::UpsPeer): a real upsd serving its dummy-ups
//! driver, whose values change as a real driver would report them, and whose server stops and
//! starts on the same port. Needs tests/harness/install-power-peers.sh (fails, not skips,
//! without it).

use std::time::Instant;

use homelab_harness::power_peers::UpsPeer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ups_peer_serves_changes_and_stops_and_starts() {
    let ups = UpsPeer::start().await.expect("upsd and dummy-ups");
    assert_eq!(ups.address(), format!("dummy@127.0.0.1:{}", ups.port()));
    assert_eq!(ups.ups_name(), "dummy");
    assert_eq!((ups.username(), ups.password()), ("monitor", "secret"));
    assert_eq!(ups.get("ups.status").await.expect("ups.status"), "OL");
    assert_eq!(ups.get("battery.charge").await.expect("battery.charge"), "100");
    assert_eq!(ups.get("device.model").await.expect("device.model"), "Test UPS");
    let unknown = ups.get("no.such.variable").await.expect_err("an unknown variable");
    assert!(format!("{unknown:#}").contains("ERR"), "{unknown:#}");

    // A power cut, as the driver reports it.
    let started = Instant::now();
    ups.set(&[("ups.status", "OB DISCHRG"), ("battery.charge", "40")]).await.expect("set");
    eprintln!("upsd served the first change {:?} after the write", started.elapsed());
    assert_eq!(ups.get("ups.status").await.expect("ups.status"), "OB DISCHRG");
    assert_eq!(ups.get("battery.charge").await.expect("battery.charge"), "40");
    assert_eq!(ups.get("battery.runtime").await.expect("kept"), "3600", "a key was lost");

    // A second change at once: within the same second as the first write.
    let started = Instant::now();
    ups.set(&[("battery.charge", "39"), ("battery.runtime", "900")]).await.expect("set again");
    eprintln!("upsd served the second change {:?} after the write", started.elapsed());
    assert_eq!(ups.get("ups.status").await.expect("ups.status"), "OB DISCHRG");

    ups.stop_server().expect("stop upsd");
    let refused = tokio::net::TcpStream::connect(("127.0.0.1", ups.port()))
        .await
        .expect_err("upsd is stopped");
    assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused, "{refused}");
    ups.get("ups.status").await.expect_err("no upsd to answer");

    let started = Instant::now();
    ups.start_server().await.expect("start upsd");
    eprintln!("upsd served again {:?} after its start", started.elapsed());
    assert_eq!(ups.get("ups.status").await.expect("ups.status"), "OB DISCHRG");
    assert_eq!(ups.get("battery.charge").await.expect("battery.charge"), "39");

    // Back on line after the restart.
    ups.set(&[("ups.status", "OL CHRG")]).await.expect("set after the restart");
}
