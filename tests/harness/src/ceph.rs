//! A real Ceph cluster from Debian's packages (`ceph-mon`, `ceph-mgr`, `ceph-osd`, installed
//! by `install-power-peers.sh`): one monitor, one manager with its Prometheus module, and one
//! OSD per machine of a pool, each on a sparse file, all on 127.0.0.1 in a directory of its
//! own. The daemons run in the foreground under the harness's wrapper, so they end with the
//! test process however it ends, and a machine going off is its OSD killed, as a machine that
//! loses power takes its OSD down with it. Failure detection is tuned for one host (a peer OSD
//! reports a dead one within seconds). Each OSD sits in a CRUSH host named after its machine,
//! and a [`Layout`] says how many copies the pool keeps and how soon a down OSD is marked out
//! (the monitor's floor on OSDs in, `mon osd min in ratio`, is off: with three OSDs its 75 %
//! would forbid marking any out). The monitor's checks of
//! the host's free disk are off: a build machine's disk is often nearly full, and the cluster
//! writes a few megabytes (a monitor refuses to start below `mon data avail crit`, by default
//! 5 % free, and warns below 30 %).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, Result, bail, ensure};
use tokio::process::Command;

use crate::eventually;
use crate::machine::Service;
use crate::ports::free_port;
use crate::process::{Janitor, Process, file_tail};

/// One OSD's bluestore file: sparse, so it costs what is written.
const OSD_BYTES: u64 = 1 << 30;

/// How a test's cluster is laid out.
#[derive(Clone, Debug)]
pub struct Layout {
    /// One OSD for each, in a CRUSH host of that name: a machine's Kubernetes node name, which
    /// is what a maintenance step names when it sets a flag on the machine's OSDs.
    pub hosts: Vec<String>,
    /// Copies of each object.
    pub size: u32,
    /// Copies that must be up for an object to be served.
    pub min_size: u32,
    /// How long an OSD may be down before the monitor marks it out and its data is rebuilt on
    /// the others; `None` is Ceph's own 10 minutes.
    pub down_out_after: Option<Duration>,
}

impl Layout {
    /// `osds` OSDs (hosts `machine-<i>`), each object on three of them, served while two are up.
    pub fn replicated_three_ways(osds: usize) -> Layout {
        Layout {
            hosts: (0..osds).map(|i| format!("machine-{i}")).collect(),
            size: 3,
            min_size: 2,
            down_out_after: None,
        }
    }
}

/// A running cluster; its daemons stop and its directory goes when it is dropped.
pub struct Ceph {
    root: PathBuf,
    conf: PathBuf,
    /// `127.0.0.1:<port>` of the manager's Prometheus module.
    pub metrics_addr: String,
    osds: Vec<Process>,
    _mgr: Process,
    _mon: Process,
    _janitor: Janitor,
}

impl Ceph {
    /// Brings up a cluster with `osds` OSDs and a pool of a few objects, replicated three ways,
    /// and waits until it is `HEALTH_OK` with every placement group active and clean.
    pub async fn start(osds: usize) -> Result<Ceph> {
        let (mut ceph, osds) = Self::for_machines(&Layout::replicated_three_ways(osds)).await?;
        let (tmp, logs) = (ceph.root.join("tmp"), ceph.root.join("log"));
        for osd in osds {
            ceph.osds.push(Process::spawn(&osd.name, &osd.program, &osd.args, &tmp, &logs)?);
        }
        ceph.fill().await?;
        Ok(ceph)
    }

    /// A cluster whose OSDs the machines run: the monitor and manager started, and for each of
    /// `layout`'s hosts an OSD made and the service that runs it, for that machine's
    /// [`MachineSpec::services`](crate::machine::MachineSpec). The OSDs share the host's
    /// loopback with the monitor, in the machine's cgroup, so they live and die with its power.
    /// Call [`Ceph::fill`] once the machines are on.
    pub async fn for_machines(layout: &Layout) -> Result<(Ceph, Vec<Service>)> {
        let root = tempfile::Builder::new().prefix("homelab-ceph-").tempdir()?.keep();
        let janitor = Janitor::start(&root)?;
        for dir in ["run", "log", "crash", "keyrings", "mon/a", "mgr/x", "osd", "tmp"] {
            std::fs::create_dir_all(root.join(dir))?;
        }
        let (mon_port, metrics_port) = (free_port()?, free_port()?);
        let conf = root.join("ceph.conf");
        let fsid = uuid();
        std::fs::write(&conf, config(&root, &fsid, mon_port, layout))?;
        let keys = root.join("keyrings");
        let mon_key = keys.join("mon.a.keyring");
        let admin_key = keys.join("client.admin.keyring");
        let (mon_key_s, admin_key_s) = (path(&mon_key), path(&admin_key));
        run(
            "ceph-authtool",
            &["--create-keyring", &mon_key_s, "--gen-key", "-n", "mon.", "--cap", "mon", "allow *"],
        )
        .await?;
        run(
            "ceph-authtool",
            &[
                "--create-keyring",
                &admin_key_s,
                "--gen-key",
                "-n",
                "client.admin",
                "--cap",
                "mon",
                "allow *",
                "--cap",
                "osd",
                "allow *",
                "--cap",
                "mgr",
                "allow *",
            ],
        )
        .await?;
        run("ceph-authtool", &[&mon_key_s, "--import-keyring", &admin_key_s]).await?;
        let monmap = path(&root.join("tmp/monmap"));
        let addr = format!("[v2:127.0.0.1:{mon_port}]");
        run("monmaptool", &["--create", "--fsid", &fsid, "--addv", "a", &addr, &monmap]).await?;
        let conf_s = path(&conf);
        run(
            "ceph-mon",
            &["-c", &conf_s, "--mkfs", "-i", "a", "--monmap", &monmap, "--keyring", &mon_key_s],
        )
        .await?;
        let logs = root.join("log");
        let daemon = |name: &str, program: &str, args: &[&str]| {
            let mut all: Vec<String> = vec!["-f".into(), "-c".into(), conf_s.clone()];
            all.extend(args.iter().map(|a| a.to_string()));
            Process::spawn(name, Path::new(&which(program)?), &all, &root.join("tmp"), &logs)
        };
        let mon = daemon("ceph-mon", "ceph-mon", &["-i", "a"])?;
        let ceph_cli = |args: Vec<String>| {
            let conf = conf.clone();
            async move { cli(&conf, &args.iter().map(String::as_str).collect::<Vec<_>>()).await }
        };
        // A loaded machine (the suites run in lanes beside the builds) slows the monitor's
        // start; a monitor that died says why in its log.
        eventually("the Ceph monitor answering", Duration::from_secs(180), || async {
            mon.ensure_running()?;
            ceph_cli(vec!["-s".into()]).await
        })
        .await
        .with_context(|| format!("the monitor's log:\n{}", mon.log_tail(30)))
        .with_context(|| format!("its own log:\n{}", file_tail(&root.join("log/mon.a.log"), 30)))?;
        let owned = |args: &[&str]| args.iter().map(|a| a.to_string()).collect::<Vec<_>>();
        for (key, value) in [
            ("mgr/prometheus/server_addr", "127.0.0.1".to_string()),
            ("mgr/prometheus/server_port", metrics_port.to_string()),
            ("mgr/prometheus/scrape_interval", "1".to_string()),
        ] {
            ceph_cli(owned(&["config", "set", "mgr", key, &value, "--force"])).await?;
        }
        ceph_cli(owned(&["mgr", "module", "enable", "prometheus", "--force"])).await?;
        let mgr_key = ceph_cli(owned(&[
            "auth",
            "get-or-create",
            "mgr.x",
            "mon",
            "allow profile mgr",
            "osd",
            "allow *",
        ]))
        .await?;
        std::fs::write(keys.join("mgr.x.keyring"), mgr_key)?;
        let mgr = daemon("ceph-mgr", "ceph-mgr", &["-i", "x"])?;
        let mut osds = Vec::new();
        for host in &layout.hosts {
            let (id, osd_uuid) = new_osd(&conf, &root).await?;
            let id = id.to_string();
            std::fs::create_dir_all(root.join("osd").join(&id))?;
            run("ceph-osd", &["-c", &conf_s, "-i", &id, "--mkfs", "--osd-uuid", &osd_uuid]).await?;
            osds.push(Service {
                name: format!("ceph-osd.{id}"),
                program: PathBuf::from(which("ceph-osd")?),
                args: vec![
                    "-f".into(),
                    "-c".into(),
                    conf_s.clone(),
                    "-i".into(),
                    id,
                    format!("--crush-location=root=default host={host}"),
                ],
                host_network: true,
            });
        }
        let ceph = Ceph {
            root: root.clone(),
            conf: conf.clone(),
            metrics_addr: format!("127.0.0.1:{metrics_port}"),
            osds: Vec::new(),
            _mgr: mgr,
            _mon: mon,
            _janitor: janitor,
        };
        Ok((ceph, osds))
    }

    /// Creates the pool and writes its objects (the OSDs must be up), then waits until every
    /// placement group is active and clean.
    pub async fn fill(&self) -> Result<()> {
        let conf_s = path(&self.conf);
        let ceph_cli = |args: Vec<String>| async move {
            self.cli(&args.iter().map(String::as_str).collect::<Vec<_>>()).await
        };
        let owned = |args: &[&str]| args.iter().map(|a| a.to_string()).collect::<Vec<_>>();
        ceph_cli(owned(&["osd", "pool", "create", "data", "8", "8", "replicated"])).await?;
        ceph_cli(owned(&["osd", "pool", "application", "enable", "data", "rados"])).await?;
        let object = self.root.join("tmp/object");
        std::fs::write(&object, vec![7u8; 65536])?;
        for i in 0..20 {
            let name = format!("object-{i}");
            run("rados", &["-c", &conf_s, "-p", "data", "put", &name, &path(&object)]).await?;
        }
        self.until_healthy(Duration::from_secs(180)).await
    }

    /// The cluster's config file, as `CEPH_CONF` names it to the `ceph` command line.
    pub fn conf(&self) -> &Path {
        &self.conf
    }

    /// Runs the `ceph` command line against the cluster: its output.
    pub async fn cli(&self, args: &[&str]) -> Result<String> {
        cli(&self.conf, args).await
    }

    /// The machine of OSD `index` lost power: the daemon is killed.
    pub fn stop_osd(&self, index: usize) -> Result<()> {
        self.osds.get(index).context("no such OSD")?.stop()
    }

    /// The machine of OSD `index` is back: the daemon starts on its data again.
    pub fn start_osd(&self, index: usize) -> Result<()> {
        self.osds.get(index).context("no such OSD")?.restart()
    }

    /// The cluster's health and its placement groups: `HEALTH_OK`, `HEALTH_WARN`…, the number of
    /// placement groups, how many are active, how many active and clean, and how many moving
    /// data.
    pub async fn status(&self) -> Result<Status> {
        let text = self.cli(&["status", "-f", "json"]).await?;
        let status: serde_json::Value = serde_json::from_str(&text)?;
        let pgs = &status["pgmap"];
        let states = pgs["pgs_by_state"].as_array().cloned().unwrap_or_default();
        let count = |pred: &dyn Fn(&str) -> bool| -> u64 {
            states
                .iter()
                .filter(|s| s["state_name"].as_str().is_some_and(pred))
                .filter_map(|s| s["count"].as_u64())
                .sum()
        };
        Ok(Status {
            health: status["health"]["status"].as_str().unwrap_or("unknown").to_owned(),
            pgs: pgs["num_pgs"].as_u64().unwrap_or(0),
            active: count(&|s| s.split('+').any(|p| p == "active")),
            clean: count(&|s| s == "active+clean"),
            moving: count(&|s| {
                s.split('+').any(|p| {
                    p == "remapped" || p.starts_with("backfill") || p.starts_with("recover")
                })
            }),
        })
    }

    /// How many OSDs are up, and how many in (the monitor marks an OSD out once it has been
    /// down too long, and its data is then rebuilt elsewhere).
    pub async fn osds_up_and_in(&self) -> Result<(u64, u64)> {
        let stat: serde_json::Value =
            serde_json::from_str(&self.cli(&["osd", "stat", "-f", "json"]).await?)?;
        let count = |key: &str| stat[key].as_u64().with_context(|| format!("{key} in {stat}"));
        Ok((count("num_up_osds")?, count("num_in_osds")?))
    }

    /// Objects copied to another OSD by recovery or backfill since the cluster began: the
    /// counter of data movement, summed over every placement group.
    pub async fn objects_recovered(&self) -> Result<u64> {
        let dump: serde_json::Value =
            serde_json::from_str(&self.cli(&["pg", "dump", "pgs", "-f", "json"]).await?)?;
        let stats = dump["pg_stats"].as_array().with_context(|| format!("pg_stats in {dump}"))?;
        Ok(stats.iter().filter_map(|pg| pg["stat_sum"]["num_objects_recovered"].as_u64()).sum())
    }

    /// The flags set on CRUSH host `host` (`noout`, `noin`…).
    pub async fn host_flags(&self, host: &str) -> Result<Vec<String>> {
        let dump: serde_json::Value =
            serde_json::from_str(&self.cli(&["osd", "dump", "-f", "json"]).await?)?;
        let flags = dump["crush_node_flags"][host].as_array().cloned().unwrap_or_default();
        Ok(flags.iter().filter_map(|f| f.as_str().map(str::to_owned)).collect())
    }

    /// Waits until the cluster is `HEALTH_OK` with every placement group active and clean.
    pub async fn until_healthy(&self, within: Duration) -> Result<()> {
        eventually("Ceph HEALTH_OK with every placement group active+clean", within, || async {
            let status = self.status().await?;
            ensure!(
                status.health == "HEALTH_OK" && status.pgs > 0 && status.clean == status.pgs,
                "{status:?}"
            );
            Ok(())
        })
        .await
        .with_context(|| self.log_tail())
    }

    fn log_tail(&self) -> String {
        file_tail(&self.root.join("log/cluster.log"), 20)
    }
}

/// The longest stretch of `samples` (in time order) in which some placement group was not
/// active: how long it lasted, when, and the status at its end; `None` if there was none.
pub fn longest_inactive(
    samples: &[(jiff::Timestamp, Status)],
) -> Option<(jiff::SignedDuration, jiff::Timestamp, Status)> {
    let mut longest: Option<(jiff::SignedDuration, jiff::Timestamp, Status)> = None;
    let mut since = None;
    for (at, status) in samples {
        if status.active == status.pgs {
            since = None;
            continue;
        }
        let lasted = at.duration_since(*since.get_or_insert(*at));
        if longest.as_ref().is_none_or(|(l, _, _)| lasted > *l) {
            longest = Some((lasted, *at, status.clone()));
        }
    }
    longest
}

/// What `ceph status` says of the cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status {
    pub health: String,
    pub pgs: u64,
    pub active: u64,
    pub clean: u64,
    /// Placement groups whose data is being moved: remapped, backfilling or recovering.
    pub moving: u64,
}

/// Runs the `ceph` command line against the cluster of `conf`: its output.
async fn cli(conf: &Path, args: &[&str]) -> Result<String> {
    let conf = path(conf);
    let mut all = vec!["-c", conf.as_str(), "--connect-timeout", "10"];
    all.extend_from_slice(args);
    run("ceph", &all).await
}

/// Allocates an OSD with a fresh cephx key, and writes its keyring: its id and uuid.
async fn new_osd(conf: &Path, root: &Path) -> Result<(u32, String)> {
    let key = run("ceph-authtool", &["--gen-print-key"]).await?.trim().to_owned();
    let osd_uuid = uuid();
    let secret = root.join("tmp/osd-secret.json");
    std::fs::write(&secret, format!("{{\"cephx_secret\": \"{key}\"}}"))?;
    let id = cli(conf, &["osd", "new", &osd_uuid, "-i", &path(&secret)]).await?;
    let id: u32 = id.trim().parse().with_context(|| format!("an OSD id from {id:?}"))?;
    let keyring = path(&root.join(format!("keyrings/osd.{id}.keyring")));
    let name = format!("osd.{id}");
    run("ceph-authtool", &["--create-keyring", &keyring, "--name", &name, "--add-key", &key])
        .await?;
    Ok((id, osd_uuid))
}

fn config(root: &Path, fsid: &str, mon_port: u16, layout: &Layout) -> String {
    let d = root.display();
    let (size, min_size) = (layout.size, layout.min_size);
    let down_out = layout.down_out_after.map_or(600, |after| after.as_secs());
    format!(
        "[global]
fsid = {fsid}
mon host = [v2:127.0.0.1:{mon_port}]
mon initial members = a
public addr = 127.0.0.1
public network = 127.0.0.1/32
ms bind msgr1 = false
ms bind ipv6 = false
auth allow insecure global id reclaim = false
run dir = {d}/run
admin socket = {d}/run/$cluster-$name.asok
pid file = {d}/run/$name.pid
log file = {d}/log/$name.log
log to stderr = false
err to stderr = false
crash dir = {d}/crash
keyring = {d}/keyrings/$name.keyring
mon data = {d}/mon/$id
mgr data = {d}/mgr/$id
osd data = {d}/osd/$id
tmp dir = {d}/tmp
osd crush chooseleaf type = 0
osd pool default size = {size}
osd pool default min size = {min_size}
osd pool default pg autoscale mode = off
mgr initial modules = prometheus
mon data avail warn = 0
mon data avail crit = 0
mon osd reporter subtree level = osd
mon osd min down reporters = 1
mon osd adjust heartbeat grace = false
mon osd down out interval = {down_out}
mon osd min in ratio = 0
osd heartbeat interval = 1
osd heartbeat grace = 5
ms async op threads = 1
mon memory target = 134217728
rocksdb cache size = 16777216

[mon]
mon cluster log file = {d}/log/cluster.log

[mgr]
mgr tick period = 1
mgr disabled modules = diskprediction_local restful iostat nfs

[osd]
osd objectstore = bluestore
bluestore block create = true
bluestore block size = {OSD_BYTES}
bluestore block db create = false
bluestore block wal create = false
bluestore fsck on mount = false
bluestore cache autotune = false
bluestore cache size = 33554432
osd memory target = 268435456
osd memory cache min = 33554432
osd op num shards = 1
osd op num threads per shard = 1
osd class update on start = false
"
    )
}

/// Runs a Ceph tool to its end: its standard output, or an error with what it said.
async fn run(program: &str, args: &[&str]) -> Result<String> {
    let out = Command::new(program)
        .args(args)
        .kill_on_drop(true)
        .output()
        .await
        .with_context(|| format!("running {program} (install-power-peers.sh installs Ceph)"))?;
    if !out.status.success() {
        bail!(
            "{program} {} ({}): {}{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn which(program: &str) -> Result<String> {
    for dir in ["/usr/bin", "/usr/sbin", "/bin", "/sbin"] {
        let candidate = Path::new(dir).join(program);
        if candidate.is_file() {
            return Ok(candidate.display().to_string());
        }
    }
    bail!("{program} is not installed (install-power-peers.sh installs Ceph)")
}

fn path(p: &Path) -> String {
    p.display().to_string()
}

fn uuid() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/uuid")
        .map(|u| u.trim().to_owned())
        .unwrap_or_default()
}
