//! A control plane a test owns serves like the shared one, and is gone once dropped: its
//! processes stopped, kube-apiserver's port closed, its directory removed.

use std::net::TcpStream;
use std::path::Path;
use std::time::Duration;

use homelab_harness::{Components, ControlPlane};
use k8s_openapi::api::core::v1::Namespace;
use kube::Api;

/// The processes whose command line mentions `dir` (every component's flags name a file in
/// its control plane's directory).
fn processes_using(dir: &Path) -> Vec<String> {
    let needle = dir.to_string_lossy().into_owned();
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("listing /proc").flatten() {
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else { continue };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmdline.contains(&needle) {
            found.push(format!("{}: {cmdline}", entry.file_name().to_string_lossy()));
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owned_control_plane_serves_and_stops_when_dropped() {
    let plane = ControlPlane::start(Components::API).await.expect("an owned control plane");
    let address = plane.api_address();
    let dir = plane.dir().to_path_buf();
    {
        let _logs = plane.logs_on_failure();
        let ns = plane.fresh_namespace("owned").await.expect("a namespace");
        let namespaces: Api<Namespace> = Api::all(plane.client().expect("client"));
        namespaces.get(&ns).await.expect("the new namespace is served");
        TcpStream::connect_timeout(&address, Duration::from_secs(1))
            .expect("kube-apiserver listens while the plane lives");
        assert!(!processes_using(&dir).is_empty(), "the components run with {}", dir.display());
    }

    drop(plane);

    let connected = TcpStream::connect_timeout(&address, Duration::from_secs(1));
    assert!(connected.is_err(), "kube-apiserver still answers on {address} after the drop");
    assert_eq!(processes_using(&dir), Vec::<String>::new(), "processes left after the drop");
    if std::env::var_os("HOMELAB_TEST_KEEP").is_none() {
        assert!(!dir.exists(), "{} is still there after the drop", dir.display());
    }
}
