//! Load generator: keeps `--concurrency` decisions in flight against Redis for
//! `--seconds` and prints one JSON line with the figures.
//!
//!     cargo run --release -p ratelimit-tests --example loadgen -- --workload w2 --capacity 10 --rate 2 \
//!         --keys 100000 --concurrency 64 --seconds 10 --redis redis://127.0.0.1:7379
//!
//! `--redis` (or `--cluster`) is required: it never loads a Redis of its
//! own choosing. Flags (unknown ones are ignored, as the shared harness's
//! contract asks): `--workload`, `--capacity`, `--rate`,
//! `--keys` (1 = one hot key, otherwise keys drawn uniformly from 0..keys),
//! `--concurrency`, `--seconds`, `--redis`, `--threads` (Tokio workers,
//! default 1), `--algorithm` (default `token_bucket`; window algorithms get
//! `capacity` per `capacity / rate` seconds), `--stats` (adds Redis's own
//! figures: commands per decision, CPU, and memory per key), and `--fill`
//! (instead of a timed run, one decision for each of `--keys` keys named by
//! ten digits, to measure memory per key).
//!
//! `--cluster URL,URL,URL` decides on a Redis Cluster instead of `--redis`
//! (give every master: `--stats` sums their figures, and skips replicas), and
//! `--dimensions 3` makes each decision a `check_all` over three dimensions
//! of the same quota, or of an ample one for the third: the user (drawn from
//! `--keys`), an IP (from a tenth as many) and one global key. With
//! `--ample-ip` the IP dimension takes the ample quota too, so that every
//! check reaches Redis and writes its three keys (without it, the IP keys run
//! out first and most checks are denials the deny cache answers).

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ratelimit::{Algorithm, DenialCause, FailurePolicy, Limiter, Quota, Rate, Request};

/// Every decision fails closed, so a backend fault is told from an answer.
const CLOSED: FailurePolicy = FailurePolicy::Closed;

struct Args {
    workload: String,
    capacity: u64,
    rate: f64,
    keys: u64,
    concurrency: usize,
    seconds: f64,
    redis: String,
    threads: usize,
    algorithm: Algorithm,
    stats: bool,
    fill: bool,
    cluster: Vec<String>,
    dimensions: usize,
    ample_ip: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        workload: "w1".into(),
        capacity: 1_000,
        rate: 500.0,
        keys: 1,
        concurrency: 64,
        seconds: 10.0,
        redis: String::new(),
        threads: 1,
        algorithm: Algorithm::TokenBucket,
        stats: false,
        fill: false,
        cluster: Vec::new(),
        dimensions: 1,
        ample_ip: false,
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < argv.len() {
        let flag = argv[i].as_str();
        if flag == "--stats" || flag == "--fill" || flag == "--ample-ip" {
            a.stats |= flag == "--stats";
            a.fill |= flag == "--fill";
            a.ample_ip |= flag == "--ample-ip";
            i += 1;
            continue;
        }
        let Some(value) = argv.get(i + 1) else {
            eprintln!("ignoring {flag}: no value");
            break;
        };
        let bad = |e: &dyn std::fmt::Display| format!("{flag} {value}: {e}");
        match flag {
            "--workload" => a.workload = value.clone(),
            "--capacity" => a.capacity = value.parse().map_err(|e| bad(&e))?,
            "--rate" => a.rate = value.parse().map_err(|e| bad(&e))?,
            "--keys" => a.keys = value.parse().map_err(|e| bad(&e))?,
            "--concurrency" => a.concurrency = value.parse().map_err(|e| bad(&e))?,
            "--seconds" => a.seconds = value.parse().map_err(|e| bad(&e))?,
            "--redis" => a.redis = value.clone(),
            "--threads" => a.threads = value.parse().map_err(|e| bad(&e))?,
            "--algorithm" => a.algorithm = value.parse().map_err(|e| bad(&e))?,
            "--cluster" => a.cluster = value.split(',').map(str::to_owned).collect(),
            "--dimensions" => a.dimensions = value.parse().map_err(|e| bad(&e))?,
            // The harness's contract: more flags may come.
            other => eprintln!("ignoring unknown flag {other}"),
        }
        i += 2;
    }
    if a.dimensions != 1 && a.dimensions != 3 {
        return Err(format!("--dimensions {}: 1 or 3", a.dimensions));
    }
    // Never a server of its own choosing: a load sent to the wrong Redis
    // writes keys and loads a function library there.
    if a.redis.is_empty() && a.cluster.is_empty() {
        return Err("name the Redis to load: --redis URL (or --cluster URL,URL,...)".to_owned());
    }
    Ok(a)
}

fn quota(a: &Args) -> Result<Quota, Box<dyn std::error::Error>> {
    // Rates such as 2.5 become exact fractions through the string form.
    let rate: Rate = format!("{}/s", a.rate).parse()?;
    Ok(if a.algorithm.is_windowed() {
        let window = Duration::from_secs_f64(a.capacity as f64 / a.rate);
        let window = Duration::from_millis(window.as_millis().max(1) as u64);
        Quota::builder(a.algorithm)
            .limit(a.capacity)
            .window(window)
            .build()?
    } else {
        Quota::builder(a.algorithm)
            .capacity(a.capacity)
            .rate(rate)
            .build()?
    })
}

struct TaskResult {
    latencies_ns: Vec<u32>,
    decisions: u64,
    admitted: u64,
    errors: u64,
}

fn percentile(sorted: &[u32], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let index = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[index.clamp(1, sorted.len()) - 1] as f64 / 1_000.0
}

async fn info(redis: &mut redis::aio::MultiplexedConnection, section: &str) -> String {
    redis::cmd("INFO")
        .arg(section)
        .query_async(redis)
        .await
        .unwrap_or_default()
}

/// Calls of the commands whose commandstats line starts with `prefix`.
fn calls(commandstats: &str, prefix: &str) -> f64 {
    commandstats
        .lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.split("calls=").nth(1))
        .filter_map(|v| v.split(',').next()?.parse::<f64>().ok())
        .sum()
}

/// INFO `section` of every server in `servers`, one after another: the
/// figures `field` and `calls` read are then sums over the servers.
async fn info_all(servers: &mut [redis::aio::MultiplexedConnection], section: &str) -> String {
    let mut all = String::new();
    for server in servers {
        all.push_str(&info(server, section).await);
        all.push('\n');
    }
    all
}

/// The sum of every `name` field in `info`.
fn field_sum(info: &str, name: &str) -> f64 {
    info.lines()
        .filter_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(':')))
        .filter_map(|v| v.trim().parse::<f64>().ok())
        .sum()
}

async fn run(a: Args) -> Result<(), Box<dyn std::error::Error>> {
    let quota = quota(&a)?;
    let builder = Limiter::builder().timeout(Duration::from_secs(5));
    let limiter = if a.cluster.is_empty() {
        builder.redis(&a.redis).build()?
    } else {
        builder.cluster(a.cluster.clone()).build()?
    };
    // The third dimension, one key every decision names: ample, so that it
    // costs Redis its work without deciding for the others.
    let global = Quota::new(1_000_000_000, "1000000000/s".parse()?)?;
    let global_key = format!("lg:{}:global", a.workload);
    let keys: Arc<Vec<String>> = Arc::new(
        (0..a.keys)
            .map(|i| format!("lg:{}:{i}", a.workload))
            .collect(),
    );
    // With three dimensions, user i's IP key: built here, not on the timed path.
    let ips: Arc<Vec<String>> = Arc::new(if a.dimensions == 3 {
        (0..keys.len())
            .map(|i| format!("{}:ip", keys[i / 10]))
            .collect()
    } else {
        Vec::new()
    });
    // The servers whose figures `--stats` sums: the one Redis, or the
    // cluster's masters.
    let mut inspect = Vec::new();
    for url in if a.cluster.is_empty() {
        std::slice::from_ref(&a.redis)
    } else {
        &a.cluster[..]
    } {
        let mut server = redis::Client::open(url.as_str())?
            .get_multiplexed_async_connection()
            .await?;
        if info(&mut server, "replication")
            .await
            .contains("role:master")
        {
            inspect.push(server);
        }
    }

    // Open the connections and load the scripts before the clock starts:
    // one at a time, then together (a batch, on a cluster its own script).
    for i in 0..8 {
        let key = format!("warm-up:{i}");
        limiter
            .check(Request::new(&quota, &key).on_error(CLOSED))
            .await?;
    }
    let warm: Vec<String> = (0..64).map(|i| format!("warm-up:{i}")).collect();
    for decision in futures::future::join_all(
        warm.iter()
            .map(|key| limiter.check(Request::new(&quota, key).cost(0).on_error(CLOSED))),
    )
    .await
    {
        decision?;
    }
    if a.cluster.is_empty() {
        let _: () = redis::cmd("DEL")
            .arg("rl:warm-up:0")
            .query_async(&mut inspect[0])
            .await
            .unwrap_or(());
    }
    for server in &mut inspect {
        let _: () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query_async(server)
            .await?;
    }
    let memory_before = field_sum(&info_all(&mut inspect, "memory").await, "used_memory");
    let cpu_before = info_all(&mut inspect, "cpu").await;

    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let mut tasks = Vec::new();
    let next_key = Arc::new(std::sync::atomic::AtomicU64::new(0));
    // Requests per key, for the token-bucket bound: one shared counter a key
    // (a map per task costs the generator more than the limiter it measures).
    let per_key: Arc<Vec<AtomicU32>> =
        Arc::new((0..keys.len()).map(|_| AtomicU32::new(0)).collect());
    for task in 0..a.concurrency {
        let next_key = next_key.clone();
        let per_key = per_key.clone();
        let fill = a.fill;
        let (limiter, keys, ips, stop) = (limiter.clone(), keys.clone(), ips.clone(), stop.clone());
        let (global, global_key, dimensions) = (global, global_key.clone(), a.dimensions);
        let ip_quota = if a.ample_ip { global } else { quota };
        tasks.push(tokio::spawn(async move {
            let mut out = TaskResult {
                latencies_ns: Vec::with_capacity(1 << 16),
                decisions: 0,
                admitted: 0,
                errors: 0,
            };
            let mut seed =
                0x2545_F491_4F6C_DD1Du64 ^ (task as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            while !stop.load(Ordering::Relaxed) {
                let index = if fill {
                    let index = next_key.fetch_add(1, Ordering::Relaxed);
                    if index >= keys.len() as u64 {
                        break;
                    }
                    index
                } else {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    seed % keys.len() as u64
                };
                let began = Instant::now();
                let outcome = if dimensions == 3 {
                    let check = [
                        Request::new(&quota, &keys[index as usize]).on_error(CLOSED),
                        Request::new(&ip_quota, &ips[index as usize]).on_error(CLOSED),
                        Request::new(&global, &global_key).on_error(CLOSED),
                    ];
                    limiter.check(check).await
                } else {
                    limiter
                        .check(Request::new(&quota, &keys[index as usize]).on_error(CLOSED))
                        .await
                };
                // A backend fault fails closed, and is counted as an error.
                let outcome = match outcome {
                    Ok(_) => Ok(true),
                    Err(denied) if denied.cause == DenialCause::Quota => Ok(false),
                    Err(_) => Err(()),
                };
                match outcome {
                    Ok(allowed) => {
                        out.decisions += 1;
                        out.admitted += u64::from(allowed);
                        per_key[index as usize].fetch_add(1, Ordering::Relaxed);
                        out.latencies_ns
                            .push(began.elapsed().as_nanos().min(u32::MAX as u128) as u32);
                    }
                    Err(_) => out.errors += 1,
                }
            }
            out
        }));
    }
    if !a.fill {
        tokio::time::sleep(Duration::from_secs_f64(a.seconds)).await;
        stop.store(true, Ordering::Relaxed);
    }
    let mut results = Vec::new();
    for task in tasks {
        results.push(task.await?);
    }
    let elapsed = start.elapsed().as_secs_f64();

    let mut latencies: Vec<u32> = results
        .iter()
        .flat_map(|r| r.latencies_ns.iter().copied())
        .collect();
    latencies.sort_unstable();
    let decisions: u64 = results.iter().map(|r| r.decisions).sum();
    let admitted: u64 = results.iter().map(|r| r.admitted).sum();
    let errors: u64 = results.iter().map(|r| r.errors).sum();
    let per_key_bound = match quota.window() {
        None => a.capacity as f64 + a.rate * elapsed,
        Some(window) => a.capacity as f64 * (elapsed / window.as_secs_f64()).ceil().max(1.0),
    };
    let max_admissible: f64 = per_key
        .iter()
        .map(|n| f64::from(n.load(Ordering::Relaxed)).min(per_key_bound))
        .sum();

    let mut json = format!(
        "{{\"decisions\": {decisions}, \"admitted\": {admitted}, \"elapsed_s\": {elapsed:.4}, \
         \"p50_us\": {:.1}, \"p99_us\": {:.1}, \"errors\": {errors}, \"max_admissible\": {max_admissible:.1}, \
         \"version\": \"ratelimit {} (redis-rs 1)\", \"algorithm\": \"{} {}\", \"backend\": \"{}\", \"dimensions\": {}",
        percentile(&latencies, 50.0),
        percentile(&latencies, 99.0),
        env!("CARGO_PKG_VERSION"),
        quota.algorithm(),
        quota,
        if a.cluster.is_empty() {
            "redis"
        } else {
            "redis-cluster"
        },
        a.dimensions,
    );
    if a.stats {
        let commandstats = info_all(&mut inspect, "commandstats").await;
        let cpu_after = info_all(&mut inspect, "cpu").await;
        let cpu = |i: &str| field_sum(i, "used_cpu_sys") + field_sum(i, "used_cpu_user");
        let redis_cpu = cpu(&cpu_after) - cpu(&cpu_before);
        let memory_after = field_sum(&info_all(&mut inspect, "memory").await, "used_memory");
        let mut dbsize = 0.0;
        for server in &mut inspect {
            dbsize += redis::cmd("DBSIZE").query_async::<f64>(server).await?;
        }
        json.push_str(&format!(
            ", \"redis_cmds_per_decision\": {:.2}, \"decisions_per_script_call\": {:.1}, \
             \"redis_busy\": {:.3}, \"redis_cpu_s_per_100k\": {:.3}, \"redis_keys\": {dbsize}, \
             \"redis_bytes_per_key\": {:.1}",
            // The INFO, CONFIG, DBSIZE calls of this report are a handful
            // against millions of decisions.
            calls(&commandstats, "cmdstat_") / decisions.max(1) as f64,
            // Calls of the function, the script or the native module.
            decisions as f64
                / (calls(&commandstats, "cmdstat_fcall:")
                    + calls(&commandstats, "cmdstat_evalsha:")
                    + calls(&commandstats, "cmdstat_ratelimit.decide:"))
                .max(1.0),
            redis_cpu / elapsed,
            redis_cpu * 100_000.0 / decisions.max(1) as f64,
            (memory_after - memory_before) / dbsize.max(1.0),
        ));
    }
    json.push('}');
    println!("{json}");
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a = parse_args()?;
    let runtime = if a.threads == 0 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(a.threads)
            .enable_all()
            .build()?
    };
    runtime.block_on(run(a))
}
