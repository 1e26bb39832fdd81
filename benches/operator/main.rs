//! The operator against a real control plane (homelab-harness): footprint and provider latency
//! by pool size, the control plane's scale-up overhead, admission, and a real machine's scale-up
//! booted cold against the same machine's resume from sleep. Results are printed, not asserted;
//! docs/performance.md holds a run and how to read it.
//!
//! ```sh
//! cargo bench --bench operator                       # everything (about 15 minutes; root)
//! cargo bench --bench operator -- pools webhook      # some sections: pools, scale-up, webhook, admission, resume
//! BENCH_POOLS=10x1,1000x50 BENCH_CALLS=5000 cargo bench --bench operator -- pools
//! ```
//!
//! Without `--bench` (that is, under `cargo test --all-targets`) every section runs once in a
//! smoke size (a pool of 10, 20 calls, a second per rate, one round each) to prove it still works.
//!
//! Knobs (environment): `BENCH_POOLS` (`<slots>x<groups>,…`, default `10x1,100x10,1000x50`),
//! `BENCH_CALLS` (sequential calls per RPC, default 2000), `BENCH_INCREASES` (IncreaseSize
//! calls per pool, default 10), `BENCH_IDLE_SECONDS` (default 10), `BENCH_RATES` (requests/s,
//! default `100,500,1000`), `BENCH_RATE_SECONDS` (per rate and rule, default 5),
//! `BENCH_RATE_ROUNDS` (rounds of every rate, default 3), `BENCH_CREATES` (creates per arm and
//! round, default 300), `BENCH_ADMISSION_ROUNDS` (rounds of the three admission arms, default 3),
//! `BENCH_ROUNDS` (scale-up rounds, default 10), `BENCH_RESUME_ROUNDS` (rounds of a cold boot
//! and a resume of one real machine, default 5; `resume` needs root),
//! `BENCH_OPERATORS` (`<path>,…`: operator binaries that `pools` measures one after another on
//! each pool size, to compare two builds in one run; default the one built beside the bench,
//! which the other sections use).

mod apiserver;
mod grpc;
mod pool;
mod process;
mod resume;
mod scale_up;
mod stats;
mod webhook;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use homelab_harness::{Components, ControlPlane};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use kube::api::{Api, PostParams};
use serde_json::json;

use process::{Operator, OperatorFiles, Usage, mib, ticks_per_second};
use stats::{ms, ratio};

/// The sizes of one run.
struct Knobs {
    pools: Vec<pool::Shape>,
    calls: usize,
    increases: usize,
    idle: Duration,
    rates: Vec<u32>,
    rate_seconds: f64,
    rate_rounds: usize,
    creates: usize,
    admission_rounds: usize,
    rounds: usize,
    resume_rounds: usize,
}

fn env<T: std::str::FromStr>(name: &str, full: T, smoke: T, is_full: bool) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(if is_full {
        full
    } else {
        smoke
    })
}

impl Knobs {
    fn read(full: bool) -> Result<Self> {
        let pools: String = env("BENCH_POOLS", "10x1,100x10,1000x50".into(), "10x1".into(), full);
        let rates: String = env("BENCH_RATES", "100,500,1000".into(), "100".into(), full);
        Ok(Knobs {
            pools: pools.split(',').map(pool::Shape::parse).collect::<Result<_>>()?,
            calls: env("BENCH_CALLS", 2000, 20, full),
            increases: env("BENCH_INCREASES", 10, 2, full),
            idle: Duration::from_secs_f64(env("BENCH_IDLE_SECONDS", 10.0, 1.0, full)),
            rates: rates.split(',').map(|r| r.trim().parse()).collect::<Result<_, _>>()?,
            rate_seconds: env("BENCH_RATE_SECONDS", 5.0, 0.5, full),
            rate_rounds: env("BENCH_RATE_ROUNDS", 3, 1, full),
            creates: env("BENCH_CREATES", 300, 10, full),
            admission_rounds: env("BENCH_ADMISSION_ROUNDS", 3, 1, full),
            rounds: env("BENCH_ROUNDS", 10, 1, full),
            resume_rounds: env("BENCH_RESUME_ROUNDS", 5, 1, full),
        })
    }
}

/// Where this run keeps its certificates and logs.
struct Run {
    plane: &'static ControlPlane,
    client: kube::Client,
    bin: PathBuf,
    /// The binaries `pools` compares (`BENCH_OPERATORS`), else `bin` alone.
    pool_bins: Vec<PathBuf>,
    dir: tempfile::TempDir,
    certs: homelab_autoscaler::tls::SelfSignedBundle,
    knobs: Knobs,
    ticks: u64,
}

impl Run {
    fn files(&self, name: &str) -> OperatorFiles<'_> {
        self.files_of(&self.bin, name)
    }

    fn files_of<'a>(&'a self, bin: &'a std::path::Path, name: &str) -> OperatorFiles<'a> {
        OperatorFiles {
            bin,
            kubeconfig: self.plane.kubeconfig_path(),
            cert_dir: self.dir.path(),
            log: self.dir.path().join(format!("{name}.log")),
        }
    }

    /// A namespace with its default ServiceAccount (the Jobs' pods need it).
    async fn namespace(&self, name: &str) -> Result<String> {
        let namespaces: Api<Namespace> = Api::all(self.client.clone());
        let ns: Namespace =
            serde_json::from_value(json!({ "metadata": { "generateName": format!("{name}-") } }))?;
        let created = namespaces.create(&PostParams::default(), &ns).await?;
        let ns = created.metadata.name.context("a generated name")?;
        let sas: Api<ServiceAccount> = Api::namespaced(self.client.clone(), &ns);
        homelab_harness::eventually(
            "the namespace's default ServiceAccount",
            Duration::from_secs(60),
            || async {
                anyhow::ensure!(sas.get_opt("default").await?.is_some(), "not yet");
                Ok(())
            },
        )
        .await?;
        Ok(ns)
    }
}

fn section(title: &str) {
    println!("\n## {title}\n");
}

#[tokio::main]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let full = args.iter().any(|a| a == "--bench");
    let wanted: Vec<&str> =
        args.iter().filter(|a| !a.starts_with('-')).map(String::as_str).collect();
    let runs = |name: &str| wanted.is_empty() || wanted.contains(&name);
    homelab_autoscaler::tls::install_crypto_provider();

    let plane = ControlPlane::shared(Components::CLUSTER).await?;
    plane.install_crds().await?;
    let dir = tempfile::tempdir()?;
    let certs =
        homelab_autoscaler::tls::issue_self_signed(&["localhost".into()], &["127.0.0.1".parse()?])?;
    certs.write_secret_layout(dir.path())?;
    let bin = homelab_harness::e2e::operator_binary(None)?;
    let pool_bins = match std::env::var("BENCH_OPERATORS") {
        Ok(list) if !list.trim().is_empty() => list.split(',').map(PathBuf::from).collect(),
        _ => vec![bin.clone()],
    };
    let run = Run {
        plane,
        client: plane.client()?,
        bin,
        pool_bins,
        dir,
        certs,
        knobs: Knobs::read(full)?,
        ticks: ticks_per_second(),
    };
    println!(
        "# operator bench ({} mode), {} cores, {}",
        if full { "full" } else { "smoke" },
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        jiff::Timestamp::now().strftime("%Y-%m-%d %H:%M UTC"),
    );

    if runs("pools") {
        pools(&run).await?;
    }
    if runs("scale-up") {
        scale_up(&run).await?;
    }
    if runs("webhook") {
        webhook_rates(&run).await?;
    }
    if runs("admission") {
        admission(&run).await?;
    }
    // Last: its World leaves admission configurations and real machines' Nodes on the shared
    // control plane until the process ends.
    if runs("resume") {
        resume(&run).await?;
    }
    Ok(())
}

/// One real machine's pod pending → Running, booted cold and woken from sleep, round by round.
async fn resume(run: &Run) -> Result<()> {
    section("Scale-up of a real machine: cold boot and resume from sleep");
    let measured = resume::run(&run.bin, run.knobs.resume_rounds).await?;
    for line in resume::lines(&measured) {
        println!("{line}");
    }
    Ok(())
}

/// Per pool size: start to ready, idle footprint, then the provider's calls as one burst.
async fn pools(run: &Run) -> Result<()> {
    section("Footprint and provider latency by pool size");
    let k = &run.knobs;
    for shape in &k.pools {
        for bin in &run.pool_bins {
            pool_with(run, shape, bin).await?;
        }
    }
    Ok(())
}

/// One pool size, measured on one operator binary, in a namespace of its own.
async fn pool_with(run: &Run, shape: &pool::Shape, bin: &std::path::Path) -> Result<()> {
    let k = &run.knobs;
    let ns = run.namespace(&format!("pool-{}x{}", shape.slots, shape.groups)).await?;
    let written = Instant::now();
    pool::write(&run.client, &ns, *shape).await?;
    println!(
        "### {} slots in {} groups, {} claims ({} ready on Ready nodes), written in {:.1}s",
        shape.slots,
        shape.groups,
        pool::CLAIMS,
        shape.live(),
        written.elapsed().as_secs_f64()
    );
    if run.pool_bins.len() > 1 {
        println!("operator: {}", bin.display());
    }
    let operator = Operator::start(&run.files_of(bin, &ns), &ns, &[]).await?;
    println!("start to ready (caches synced): {}", ms(operator.start_to_ready));
    let at_ready = operator.usage()?;
    // Right after ready the controllers reconcile every object once (and write every slot's
    // status); idle is measured once that wave is over.
    let settled = settle(&operator, run.ticks).await?;
    println!(
        "pid {}: first reconcile of everything done {:.1} s after ready (cpu {:.1}% of a core meanwhile, peak rss {})",
        operator.pid,
        settled.at.duration_since(at_ready.at).as_secs_f64(),
        settled.cpu_percent_since(&at_ready, run.ticks),
        mib(settled.peak_kib),
    );
    tokio::time::sleep(k.idle).await;
    let idle = operator.usage()?;
    println!(
        "idle ({:.0} s): cpu {:.2}% of a core, rss {}, {} sockets open",
        k.idle.as_secs_f64(),
        idle.cpu_percent_since(&settled, run.ticks),
        mib(idle.rss_kib),
        process::sockets(operator.pid)?,
    );

    let mut client = grpc::connect(operator.grpc_port, &run.certs).await?;
    let group = pool::group_name(0);
    grpc::warm(&mut client, &group).await;
    let before = operator.usage()?;
    let mut lines = Vec::new();
    for call in grpc::Call::READS {
        let samples = grpc::time_calls(&mut client, call, &group, k.calls).await;
        lines.push(samples.line(call.name()));
    }
    let free = shape.slots / shape.groups.max(1) - shape.live() / shape.groups.max(1);
    let increases = grpc::time_increases(&mut client, &group, k.increases.min(free)).await;
    lines.push(increases.line("NodeGroupIncreaseSize (+1, one after another)"));
    let after: Usage = operator.usage()?;
    for line in lines {
        println!("{line}");
    }
    println!(
        "burst ({} calls in {:.1} s): cpu {:.1}% of a core, rss {}, peak rss {}",
        k.calls * grpc::Call::READS.len() + increases.len(),
        after.at.duration_since(before.at).as_secs_f64(),
        after.cpu_percent_since(&before, run.ticks),
        mib(after.rss_kib),
        mib(after.peak_kib),
    );
    operator.stop().await?;
    pool::remove_nodes(&run.client, &ns).await?;
    Ok(())
}

/// Waits (at most 120 s) until the operator spends under 2% of a core over a 2 s window.
async fn settle(operator: &Operator, ticks: u64) -> Result<Usage> {
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut last = operator.usage()?;
    loop {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let now = operator.usage()?;
        if now.cpu_percent_since(&last, ticks) < 2.0 || Instant::now() > deadline {
            return Ok(now);
        }
        last = now;
    }
}

async fn scale_up(run: &Run) -> Result<()> {
    section("Scale-up overhead (a machine that boots in zero time)");
    let ns = run.namespace("scale-up").await?;
    let lab = format!("{ns}-lab");
    run.plane
        .add_machine(&lab, vec![], [("bench.homecluster.dev/lab".to_string(), lab.clone())].into())
        .await?;
    let slot = format!("{ns}-m1");
    scale_up::write_pool(&run.client, &ns, &slot, &lab).await?;
    let files = run.files(&format!("{ns}-simulator"));
    let log = std::fs::File::create(&files.log)?;
    let _simulator = tokio::process::Command::new(&run.bin)
        .args(["simulate", &format!("--namespace={ns}"), "--boot-delay=0s", "--gate-delay=0s"])
        .env("KUBECONFIG", run.plane.kubeconfig_path())
        .stdout(std::process::Stdio::from(log.try_clone()?))
        .stderr(std::process::Stdio::from(log))
        .kill_on_drop(true)
        .spawn()?;
    let operator = Operator::start(&run.files(&ns), &ns, &[]).await?;
    let mut client = grpc::connect(operator.grpc_port, &run.certs).await?;
    let result = scale_up::run(&run.client, &ns, &slot, &mut client, run.knobs.rounds).await;
    let overheads = result.with_context(|| format!("operator log:\n{}", operator.log_tail()))?;
    for line in scale_up::lines(&overheads) {
        println!("{line}");
    }
    operator.stop().await?;
    run.plane.remove_machine(&lab).await?;
    Ok(())
}

async fn webhook_rates(run: &Run) -> Result<()> {
    section("Webhook latency in-process over HTTPS (HTTP/2, one keep-alive connection)");
    let ns = run.namespace("webhook").await?;
    webhook::write_pool(&run.client, &ns, 10).await?;
    let server = webhook::Server::start(run.plane, &ns, webhook::Handler::Rules).await?;
    let noop = webhook::Server::start(run.plane, &ns, webhook::Handler::AllowAll).await?;
    let h2 = webhook::H2::connect(server.port, &run.plane.ca_pem()).await?;
    let noop_h2 = webhook::H2::connect(noop.port, &run.plane.ca_pem()).await?;
    let k = &run.knobs;
    // Per rate, each round's claim-rule p99 and (claim p50, no-op p50).
    type Rounds = (u32, Vec<Duration>, Vec<(Duration, Duration)>);
    let mut by_rate: Vec<Rounds> =
        k.rates.iter().map(|&rate| (rate, Vec::new(), Vec::new())).collect();
    for round in 1..=k.rate_rounds {
        for (rate, p99s, p50s) in &mut by_rate {
            let rate = *rate;
            println!("### round {round}, {rate} requests/s, {} s each", k.rate_seconds);
            let mut claim = stats::Samples::default();
            for rule in webhook::Rule::ALL {
                let samples = webhook::rule_at(&h2, &ns, rule, rate, k.rate_seconds).await;
                println!("{}", samples.line(rule.name()));
                if matches!(rule, webhook::Rule::Claim) {
                    claim = samples;
                }
            }
            let floor =
                webhook::rule_at(&noop_h2, &ns, webhook::Rule::Claim, rate, k.rate_seconds).await;
            println!("{}", floor.line("no-op handler (the claim's review, allowed unread)"));
            println!(
                "claim webhook / no-op handler: p50 {:.2}, p99 {:.2}",
                ratio(claim.quantile(0.5), floor.quantile(0.5)),
                ratio(claim.quantile(0.99), floor.quantile(0.99)),
            );
            // Last, once: at these rates the reads saturate the apiserver, whose backlog would
            // spill into whatever ran next.
            if round == k.rate_rounds {
                let reads = webhook::claim_reads_at(&run.client, &ns, rate, k.rate_seconds).await;
                println!(
                    "{}",
                    reads.line("the claim rule's 3 reads alone, straight to the apiserver")
                );
                println!(
                    "claim webhook / its reads alone: p50 {:.2}, p99 {:.2}",
                    ratio(claim.quantile(0.5), reads.quantile(0.5)),
                    ratio(claim.quantile(0.99), reads.quantile(0.99))
                );
            }
            p99s.push(claim.quantile(0.99));
            p50s.push((claim.quantile(0.5), floor.quantile(0.5)));
        }
    }
    println!("\nthe claim rule, round by round:");
    for (rate, p99s, p50s) in &by_rate {
        let p99s: Vec<String> = p99s.iter().map(|d| ms(*d)).collect();
        let p50s: Vec<String> =
            p50s.iter().map(|(ours, floor)| format!("{:.2}", ratio(*ours, *floor))).collect();
        println!("{rate:>5}/s  p99 {}  p50 / no-op p50 {}", p99s.join(", "), p50s.join(", "));
    }
    drop((server, noop));
    Ok(())
}

async fn admission(run: &Run) -> Result<()> {
    section("kube-apiserver create latency of a NodeClaim: without webhooks, no-op webhooks, ours");
    use webhook::Route;
    let ns = run.namespace("admission").await?;
    let (n, rounds) = (run.knobs.creates, run.knobs.admission_rounds);
    let arms = [Route::Nowhere, Route::Floor, Route::Ours];
    webhook::write_pool(&run.client, &ns, arms.len() * rounds * n + 1).await?;
    let ours = webhook::Server::start(run.plane, &ns, webhook::Handler::Rules).await?;
    let floor = webhook::Server::start(run.plane, &ns, webhook::Handler::AllowAll).await?;
    let mut seen: std::collections::BTreeMap<Route, Vec<Arm>> = Default::default();
    let mut served: std::collections::BTreeMap<Route, Vec<webhook::Served>> = Default::default();
    let mut own = Vec::new();
    let mut connections: std::collections::BTreeMap<Route, usize> = Default::default();
    // Slot 0 stays free (the routing probe's); each arm of each round creates claims for slots
    // of its own. Each round starts with a different arm, so none always follows the same one.
    let mut next = 1;
    for round in 0..rounds {
        for k in 0..arms.len() {
            let arm = arms[(round + k) % arms.len()];
            webhook::route(run.plane, &ns, arm, &ours, &floor).await?;
            let server = if arm == Route::Floor { &floor } else { &ours };
            let open_before = apiserver::connections_to(server.port)?;
            let own_before = apiserver::scrape_own();
            let created = creates_seen(run, &ns, next..next + n).await?;
            if arm == Route::Ours {
                own.push((own_before, apiserver::scrape_own()));
            }
            if arm != Route::Nowhere {
                let opened =
                    apiserver::connections_to(server.port)?.difference(&open_before).count();
                *connections.entry(arm).or_default() += opened;
                served.entry(arm).or_default().extend(server.take_calls());
            }
            next += n;
            println!(
                "{}",
                created.samples.line(&format!("round {}: create, {}", round + 1, arm.name()))
            );
            seen.entry(arm).or_default().push(created);
        }
    }
    webhook::route(run.plane, &ns, Route::Nowhere, &ours, &floor).await?;

    let pooled = |arm: Route| {
        let mut all = stats::Samples::default();
        for created in seen.get(&arm).into_iter().flatten() {
            all.absorb(&created.samples);
        }
        all
    };
    let (without, noop, with) = (pooled(Route::Nowhere), pooled(Route::Floor), pooled(Route::Ours));
    println!("\nthe {rounds} rounds pooled:");
    for (arm, samples) in [(Route::Nowhere, &without), (Route::Floor, &noop), (Route::Ours, &with)]
    {
        println!("{}", samples.line(&format!("create, {}", arm.name())));
    }
    let q = |s: &stats::Samples, p: f64| s.quantile(p);
    println!(
        "ours / no-op (target at most 1.15): p50 {:.2}, p99 {:.2}; no-op / without: p50 {:.2}, p99 {:.2}",
        ratio(q(&with, 0.5), q(&noop, 0.5)),
        ratio(q(&with, 0.99), q(&noop, 0.99)),
        ratio(q(&noop, 0.5), q(&without, 0.5)),
        ratio(q(&noop, 0.99), q(&without, 0.99)),
    );

    println!(
        "\nkube-apiserver's view, calls and mean per call in each arm, rounds pooled (its /metrics before and after each):"
    );
    println!("{:<44} {:>18} {:>18} {:>18}", "", arms[0].name(), "no-op webhooks", "our webhooks");
    let cell = |(calls, mean): (u64, Duration)| format!("n={calls:<4} {:>9}", ms(mean));
    for row in apiserver::create_rows(
        homelab_autoscaler::webhook::configuration::STAMP_CLAIMS,
        homelab_autoscaler::webhook::configuration::VALIDATE_CLAIMS,
    ) {
        let of = |arm: Route| {
            let arms = seen.get(&arm).into_iter().flatten();
            stats::pooled_mean(arms.map(|created| created.after.since(&created.before, &row)))
        };
        println!(
            "{:<44} {:>18} {:>18} {:>18}",
            row.title,
            cell(of(Route::Nowhere)),
            cell(of(Route::Floor)),
            cell(of(Route::Ours)),
        );
    }
    for (arm, calls) in &served {
        println!("the server of the arm with {} (router in to response out):", arm.name());
        let paths: std::collections::BTreeSet<&str> =
            calls.iter().map(|s| s.path.as_str()).collect();
        for path in paths {
            let mut samples = stats::Samples::default();
            let mut versions = std::collections::BTreeSet::new();
            for call in calls.iter().filter(|s| s.path == path) {
                samples.push(call.took);
                versions.insert(format!("{:?}", call.version));
            }
            let versions = versions.into_iter().collect::<Vec<_>>().join(", ");
            println!("{}  mean={}  {versions}", samples.line(path), ms(samples.mean()));
        }
    }
    for row in apiserver::own_rows() {
        let (calls, mean) =
            stats::pooled_mean(own.iter().map(|(before, after)| after.since(before, &row)));
        println!("{:<52} n={calls:<6} mean={}", row.title, ms(mean));
    }
    println!(
        "TCP connections opened during the arms (the routing probe's, before each, reused): our server {}, the no-op server {}",
        connections.get(&Route::Ours).copied().unwrap_or_default(),
        connections.get(&Route::Floor).copied().unwrap_or_default(),
    );
    drop((ours, floor));
    Ok(())
}

/// One arm of creates, and the apiserver's metrics just before and just after it.
struct Arm {
    samples: stats::Samples,
    before: apiserver::Scrape,
    after: apiserver::Scrape,
}

async fn creates_seen(run: &Run, ns: &str, slots: std::ops::Range<usize>) -> Result<Arm> {
    let before = apiserver::scrape(&run.client).await?;
    let samples = webhook::time_creates(&run.client, ns, slots).await;
    let after = apiserver::scrape(&run.client).await?;
    Ok(Arm { samples, before, after })
}
