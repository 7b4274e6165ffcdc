//! Private `redis-server` processes for tests: each test starts its own, on a
//! free loopback port, with nothing saved to disk, and kills it on drop. The
//! server's log is printed when the test fails.
#![allow(dead_code)] // each test binary uses a different part of this module

use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const INSTALL_HINT: &str = "install Redis (Debian/Ubuntu: `apt-get install redis-server`; \
     macOS: `brew install redis`) or set RATELIMIT_REDIS_SERVER to the path of a redis-server binary";

/// The `redis-server` binary: `RATELIMIT_REDIS_SERVER`, or the one on `PATH`.
pub fn redis_server_binary() -> PathBuf {
    let binary: PathBuf = std::env::var_os("RATELIMIT_REDIS_SERVER")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("redis-server"));
    match Command::new(&binary).arg("--version").output() {
        Ok(out) if out.status.success() => binary,
        Ok(out) => panic!(
            "`{} --version` failed ({}): {}; {INSTALL_HINT}",
            binary.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ),
        Err(e) => panic!(
            "this test needs a real redis-server, and `{}` could not be run ({e}); {INSTALL_HINT}",
            binary.display()
        ),
    }
}

/// A private Redis server, killed when dropped.
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
    binary: PathBuf,
    extra: Vec<String>,
    /// Serves TLS only, on `port`, with a certificate this CA (PEM) signed.
    tls: Option<Vec<u8>>,
    /// A Sentinel's configuration file (the server runs `--sentinel`).
    sentinel_config: Option<PathBuf>,
}

impl RedisServer {
    /// Starts a server and waits until it accepts connections.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Starts a server with extra `redis-server` arguments.
    pub fn start_with(extra: &[&str]) -> Self {
        let binary = redis_server_binary();
        let mut last_log = String::new();
        // Another process may take the free port between our probe and the
        // server's bind; a few attempts make that harmless.
        for _ in 0..5 {
            let dir = tempfile::tempdir().expect("create a temp dir for redis-server");
            let mut server = RedisServer {
                child: None,
                port: free_port(),
                dir,
                binary: binary.clone(),
                extra: extra.iter().map(|s| s.to_string()).collect(),
                tls: None,
                sentinel_config: None,
            };
            if server.spawn() {
                return server;
            }
            last_log = server.log();
        }
        panic!("redis-server did not start; its last log:\n{last_log}");
    }

    /// Starts a server that speaks TLS only, with `certificates`' server
    /// certificate; `client_certificates` says whether clients must present
    /// one signed by the test CA.
    pub fn start_tls(certificates: &TlsFiles, client_certificates: bool) -> Self {
        Self::start_tls_with(certificates, client_certificates, &[])
    }

    /// [`start_tls`](Self::start_tls) with extra `redis-server` arguments.
    pub fn start_tls_with(
        certificates: &TlsFiles,
        client_certificates: bool,
        more: &[&str],
    ) -> Self {
        let binary = redis_server_binary();
        let mut last_log = String::new();
        for _ in 0..5 {
            let port = free_port();
            let mut server = RedisServer {
                child: None,
                port,
                dir: tempfile::tempdir().expect("create a temp dir for redis-server"),
                binary: binary.clone(),
                extra: vec![
                    "--port".into(),
                    "0".into(),
                    "--tls-port".into(),
                    port.to_string(),
                    "--tls-cert-file".into(),
                    certificates.path("server.pem"),
                    "--tls-key-file".into(),
                    certificates.path("server.key"),
                    "--tls-ca-cert-file".into(),
                    certificates.path("ca.pem"),
                    "--tls-auth-clients".into(),
                    if client_certificates { "yes" } else { "no" }.into(),
                ]
                .into_iter()
                .chain(more.iter().map(|s| s.to_string()))
                .collect(),
                tls: Some(certificates.read("ca.pem")),
                sentinel_config: None,
            };
            if server.spawn() {
                return server;
            }
            last_log = server.log();
        }
        panic!(
            "redis-server with TLS did not start (Debian's redis-server is built with TLS; \
             a build without it refuses --tls-port); its last log:\n{last_log}"
        );
    }

    /// A Sentinel watching the master `name` at 127.0.0.1:`master_port`,
    /// with a quorum of 2, calling it down after 1 s without an answer;
    /// serving TLS only with `tls`'s server certificate and reaching the
    /// master, its replicas and the other Sentinels over TLS
    /// (`tls-replication yes`) when given.
    pub fn start_sentinel(name: &str, master_port: u16, tls: Option<&TlsFiles>) -> Self {
        let binary = redis_server_binary();
        let mut last_log = String::new();
        for _ in 0..5 {
            let dir = tempfile::tempdir().expect("create a temp dir for a sentinel");
            let config = dir.path().join("sentinel.conf");
            let port = free_port();
            let mut text = format!(
                "sentinel monitor {name} 127.0.0.1 {master_port} 2\n\
                 sentinel down-after-milliseconds {name} 1000\n\
                 sentinel failover-timeout {name} 3000\n\
                 sentinel parallel-syncs {name} 1\n"
            );
            let mut extra = Vec::new();
            if let Some(files) = tls {
                text.push_str(&format!(
                    "tls-cert-file {}\ntls-key-file {}\ntls-ca-cert-file {}\n\
                     tls-auth-clients no\ntls-replication yes\n",
                    files.path("server.pem"),
                    files.path("server.key"),
                    files.path("ca.pem"),
                ));
                // After the `--port` every server is given.
                extra = vec![
                    "--port".into(),
                    "0".into(),
                    "--tls-port".into(),
                    port.to_string(),
                ];
            }
            std::fs::write(&config, text).expect("write the sentinel's configuration");
            let mut server = RedisServer {
                child: None,
                port,
                dir,
                binary: binary.clone(),
                extra,
                tls: tls.map(|files| files.read("ca.pem")),
                sentinel_config: Some(config),
            };
            if server.spawn() {
                return server;
            }
            last_log = server.log();
        }
        panic!("redis-server --sentinel did not start; its last log:\n{last_log}");
    }

    fn spawn(&mut self) -> bool {
        let mut command = Command::new(&self.binary);
        if let Some(config) = &self.sentinel_config {
            command.arg(config).arg("--sentinel");
        }
        let child = command
            .arg("--port")
            .arg(self.port.to_string())
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .arg("--logfile")
            .arg(self.log_path())
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}; {INSTALL_HINT}", self.binary.display()));
        self.child = Some(child);
        self.wait_ready(Duration::from_secs(10))
    }

    /// Kills the server and starts a new one on the same port: every key is
    /// lost, as after a crash.
    pub fn restart(&mut self) {
        self.kill();
        for _ in 0..50 {
            if self.spawn() {
                return;
            }
            // The old socket may linger a moment.
            self.kill();
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!(
            "redis-server did not restart on port {}:\n{}",
            self.port,
            self.log()
        );
    }

    /// What a server holds: each key's type and value (a sorted set's scores:
    /// its members carry each request's own tag) and its expiry in ms. A
    /// cluster node's own keys, a replica's too.
    #[allow(dead_code)]
    pub async fn holdings(&self) -> std::collections::BTreeMap<String, (String, i64)> {
        let mut connection = self.connection().await;
        // A cluster replica answers reads of its keys only after READONLY;
        // any other server refuses it, which changes nothing.
        let _ = redis::cmd("READONLY")
            .query_async::<redis::Value>(&mut connection)
            .await;
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg("*")
            .query_async(&mut connection)
            .await
            .unwrap();
        let mut held = std::collections::BTreeMap::new();
        for key in keys {
            let kind: String = redis::cmd("TYPE")
                .arg(&key)
                .query_async(&mut connection)
                .await
                .unwrap();
            let value = match kind.as_str() {
                "string" => match redis::cmd("GET")
                    .arg(&key)
                    .query_async::<Option<String>>(&mut connection)
                    .await
                    .unwrap()
                {
                    Some(value) => value,
                    None => continue,
                },
                "zset" => {
                    let scored: Vec<(String, String)> = redis::cmd("ZRANGE")
                        .arg(&key)
                        .arg(0)
                        .arg(-1)
                        .arg("WITHSCORES")
                        .query_async(&mut connection)
                        .await
                        .unwrap();
                    let scores: Vec<String> = scored.into_iter().map(|(_, s)| s).collect();
                    format!("zset {scores:?}")
                }
                // Expired since KEYS listed it.
                "none" => continue,
                other => format!("a {other}"),
            };
            let expires: i64 = redis::cmd("PEXPIRETIME")
                .arg(&key)
                .query_async(&mut connection)
                .await
                .unwrap();
            held.insert(key, (value, expires));
        }
        held
    }

    /// A replica of `master`, started with `extra` arguments too, once it
    /// has synced: the master's later writes reach it as commands.
    #[allow(dead_code)]
    pub async fn replica_of(master: &RedisServer, extra: &[&str]) -> Self {
        let port = master.port().to_string();
        let mut args = vec!["--replicaof", "127.0.0.1", port.as_str()];
        args.extend(extra);
        let replica = Self::start_with(&args);
        replica.wait_until_synced().await;
        replica
    }

    /// Waits until this replica has synced with its master (ten seconds at
    /// most), so that the master's later writes reach it as commands, not
    /// in a snapshot.
    pub async fn wait_until_synced(&self) {
        let mut connection = self.connection().await;
        for _ in 0..100 {
            let info: String = redis::cmd("INFO")
                .arg("replication")
                .query_async(&mut connection)
                .await
                .unwrap();
            if info.contains("master_link_status:up") {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        panic!("the replica did not sync:\n{}", self.log());
    }

    /// Waits until this master's replica has acknowledged every write so far
    /// (ten seconds at most). `WAIT` waits for a connection's own last write,
    /// so this one writes and deletes a key first: in the slot of a key the
    /// server holds, so that a cluster node takes it.
    #[allow(dead_code)]
    pub async fn wait_for_replicas(&self) {
        let mut connection = self.connection().await;
        let held: Vec<String> = redis::cmd("KEYS")
            .arg("*")
            .query_async(&mut connection)
            .await
            .unwrap();
        let marker = match held.first() {
            Some(key) if !key.contains('{') => format!("{{{key}}}:replicated"),
            _ => "replicated".to_owned(),
        };
        let _: () = redis::cmd("SET")
            .arg(&marker)
            .arg(1)
            .query_async(&mut connection)
            .await
            .unwrap();
        let _: () = redis::cmd("DEL")
            .arg(&marker)
            .query_async(&mut connection)
            .await
            .unwrap();
        // Each WAIT shorter than the client's response timeout.
        for _ in 0..25 {
            let acknowledged: i64 = redis::cmd("WAIT")
                .arg(1)
                .arg(400)
                .query_async(&mut connection)
                .await
                .unwrap();
            if acknowledged == 1 {
                return;
            }
        }
        panic!(
            "the replica did not acknowledge the writes:\n{}",
            self.log()
        );
    }

    /// Freezes the server (SIGSTOP): connections stay open, nothing answers.
    pub fn freeze(&self) {
        self.signal("-STOP");
    }

    /// Thaws a frozen server (SIGCONT).
    pub fn thaw(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        let pid = self.child.as_ref().expect("a running redis-server").id();
        let status = Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill {signal} {pid} failed");
    }

    fn wait_ready(&mut self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(_)) = child.try_wait() {
                    return false;
                }
            }
            if self.tls.is_some() {
                // No plaintext PING on a TLS port: the server says when it
                // is ready in its log.
                // (a Sentinel, when it starts monitoring).
                let log = self.log();
                if TcpStream::connect(("127.0.0.1", self.port)).is_ok()
                    && (log.contains("Ready to accept connections") || log.contains("+monitor"))
                {
                    return true;
                }
            } else if let Ok(mut stream) = TcpStream::connect(("127.0.0.1", self.port)) {
                use std::io::Write;
                let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
                if stream.write_all(b"PING\r\n").is_ok() {
                    let mut buf = [0u8; 7];
                    if stream.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n" {
                        return true;
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// The port the server listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>` (`rediss://` for a TLS server).
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    /// A plain client for inspecting the server from the test.
    pub fn client(&self) -> redis::Client {
        match &self.tls {
            Some(ca) => redis::Client::build_with_tls(
                self.url(),
                redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(ca.clone()),
                },
            ),
            None => redis::Client::open(self.url()),
        }
        .expect("client for the private redis-server")
    }

    /// A connection for inspecting the server from the test.
    pub async fn connection(&self) -> redis::aio::MultiplexedConnection {
        self.client()
            .get_multiplexed_async_connection()
            .await
            .unwrap_or_else(|e| panic!("connect to the private redis-server: {e}\n{}", self.log()))
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("redis.log")
    }

    /// Script calls (`FCALL` of the limiter's function, or `EVALSHA`) the
    /// server has run since the last `CONFIG RESETSTAT`, from
    /// `INFO commandstats`.
    pub async fn script_calls(&self) -> u64 {
        self.command_calls(&["fcall", "evalsha"]).await
    }

    /// Calls of `commands` the server has run since the last
    /// `CONFIG RESETSTAT`, from `INFO commandstats`.
    pub async fn command_calls(&self, commands: &[&str]) -> u64 {
        self.command_stat(commands, "calls").await
    }

    /// Calls of `commands` the server was sent, run or refused before they
    /// ran (over `maxmemory`, say), since the last `CONFIG RESETSTAT`.
    pub async fn commands_sent(&self, commands: &[&str]) -> u64 {
        self.command_calls(commands).await + self.command_stat(commands, "rejected_calls").await
    }

    /// The `field` of `commands` in `INFO commandstats`, summed.
    async fn command_stat(&self, commands: &[&str], field: &str) -> u64 {
        let field = format!("{field}=");
        let mut connection = self.connection().await;
        let stats: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut connection)
            .await
            .unwrap_or_default();
        stats
            .lines()
            .filter(|l| {
                l.strip_prefix("cmdstat_")
                    .and_then(|l| l.split(':').next())
                    .is_some_and(|name| commands.contains(&name))
            })
            .filter_map(|l| {
                let (_, stats) = l.split_once(':')?;
                stats.split(',').find_map(|stat| stat.strip_prefix(&field))
            })
            .filter_map(|v| v.parse::<u64>().ok())
            .sum()
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// Kills the server (connections are refused from now on).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            // A frozen server must be thawed to die promptly on some systems.
            let _ = Command::new("kill")
                .args(["-CONT", &child.id().to_string()])
                .status();
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            eprintln!(
                "--- log of redis-server on port {} ---\n{}",
                self.port,
                self.log()
            );
        }
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("find a free loopback port")
}

/// The arguments of every node of a test cluster.
const CLUSTER_NODE_ARGS: &[&str] = &[
    "--cluster-enabled",
    "yes",
    "--cluster-config-file",
    "nodes.conf",
    "--cluster-node-timeout",
    "1000",
    // A replica of a fresh cluster may have synced long ago by this
    // measure; let it take over regardless.
    "--cluster-replica-validity-factor",
    "0",
    // While a master is down, the others keep serving their own slots
    // (Redis's default refuses every key until a replica has taken over),
    // as a deployment that wants a dead master to cost only its own keys
    // configures it.
    "--cluster-require-full-coverage",
    "no",
];

/// A private Redis Cluster on loopback: `masters` masters with `replicas`
/// replicas each, every node its own `redis-server --cluster-enabled yes`,
/// joined with `redis-cli --cluster create`. Killed on drop.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
    /// `redis-cli` arguments that reach the nodes (TLS ones for a TLS cluster).
    cli_tls: Vec<String>,
}

impl RedisCluster {
    pub fn start(masters: usize, replicas: usize) -> Self {
        Self::start_inner(masters, replicas, None, &[])
    }

    /// A cluster whose every node also takes `extra` arguments (a module
    /// to load).
    pub fn start_with(masters: usize, replicas: usize, extra: &[&str]) -> Self {
        Self::start_inner(masters, replicas, None, extra)
    }

    /// A cluster whose nodes speak TLS only, to clients and to each other.
    pub fn start_tls(masters: usize, certificates: &TlsFiles) -> Self {
        Self::start_inner(masters, 0, Some(certificates), &[])
    }

    fn start_inner(
        masters: usize,
        replicas: usize,
        tls: Option<&TlsFiles>,
        extra: &[&str],
    ) -> Self {
        let cli = std::env::var_os("RATELIMIT_REDIS_CLI")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("redis-cli"));
        if Command::new(&cli).arg("--version").output().is_err() {
            panic!(
                "this test needs redis-cli to build a Redis Cluster, and `{}` could not be run; {INSTALL_HINT}",
                cli.display()
            );
        }
        let mut cluster_args = CLUSTER_NODE_ARGS.to_vec();
        cluster_args.extend_from_slice(extra);
        let nodes: Vec<RedisServer> = (0..masters * (1 + replicas))
            .map(|_| match tls {
                Some(files) => {
                    let mut args = cluster_args.clone();
                    args.extend(["--tls-cluster", "yes", "--tls-replication", "yes"]);
                    RedisServer::start_tls_with(files, false, &args)
                }
                None => RedisServer::start_with(&cluster_args),
            })
            .collect();
        let cli_tls: Vec<String> = match tls {
            Some(files) => vec!["--tls".into(), "--cacert".into(), files.path("ca.pem")],
            None => Vec::new(),
        };
        let addresses: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        let out = Command::new(&cli)
            .args(&cli_tls)
            .arg("--cluster")
            .arg("create")
            .args(&addresses)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .output()
            .expect("run redis-cli --cluster create");
        let cluster = RedisCluster { nodes, cli_tls };
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        cluster.wait_until_ok(Duration::from_secs(30));
        cluster
    }

    /// Adds a master that serves no slot yet (as a scale-out does before
    /// slots are moved to it), started with `extra` arguments besides the
    /// cluster's own; its index. Plain (not TLS) clusters.
    #[allow(dead_code)]
    pub fn add_empty_master(&mut self, extra: &[&str]) -> usize {
        let mut args = CLUSTER_NODE_ARGS.to_vec();
        args.extend_from_slice(extra);
        let node = RedisServer::start_with(&args);
        let (host, port) = ("127.0.0.1", node.port());
        let _: () = redis::cmd("CLUSTER")
            .arg("MEET")
            .arg(host)
            .arg(port)
            .query(&mut self.node_connection(self.masters()[0]))
            .expect("CLUSTER MEET");
        self.nodes.push(node);
        let index = self.nodes.len() - 1;
        let id = self.node_id(index);
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self
            .nodes
            .iter()
            .filter(|n| n.child.is_some())
            .all(|n| self.info(n, "NODES").contains(&id))
        {
            assert!(
                Instant::now() < deadline,
                "the new master did not join the cluster"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        self.wait_until_ok(Duration::from_secs(30));
        index
    }

    /// `redis://127.0.0.1:<port>` of every node still running.
    pub fn urls(&self) -> Vec<String> {
        self.nodes
            .iter()
            .filter(|n| n.child.is_some())
            .map(|n| n.url())
            .collect()
    }

    fn info(&self, node: &RedisServer, what: &str) -> String {
        if node.tls.is_some() {
            let cli = std::env::var_os("RATELIMIT_REDIS_CLI")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from("redis-cli"));
            return Command::new(cli)
                .args(&self.cli_tls)
                .args(["-p", &node.port().to_string(), "CLUSTER", what])
                .output()
                .map(|out| String::from_utf8_lossy(&out.stdout).into_owned())
                .unwrap_or_default();
        }
        node.client()
            .get_connection()
            .and_then(|mut c| redis::cmd("CLUSTER").arg(what).query::<String>(&mut c))
            .unwrap_or_default()
    }

    /// Waits until every running node reports `cluster_state:ok` and all
    /// 16,384 slots are served by a running master.
    pub fn wait_until_ok(&self, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let ok = self.nodes.iter().filter(|n| n.child.is_some()).all(|n| {
                let info = self.info(n, "INFO");
                info.contains("cluster_state:ok") && info.contains("cluster_slots_ok:16384")
            });
            if ok {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the Redis Cluster did not become ready within {within:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until every node still running reports the cluster down
    /// (`cluster_state:fail`), as after a master with no replica died.
    #[allow(dead_code)]
    pub fn wait_until_down(&self, within: Duration) {
        let deadline = Instant::now() + within;
        while !self
            .nodes
            .iter()
            .filter(|n| n.child.is_some())
            .all(|n| self.info(n, "INFO").contains("cluster_state:fail"))
        {
            assert!(
                Instant::now() < deadline,
                "the Redis Cluster did not go down within {within:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Indexes of the nodes that are masters now.
    pub fn masters(&self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|&i| self.nodes[i].child.is_some())
            .filter(|&i| {
                let node = &self.nodes[i];
                node.client()
                    .get_connection()
                    .and_then(|mut c| redis::cmd("ROLE").query::<redis::Value>(&mut c))
                    .map(|role| format!("{role:?}").contains("master"))
                    .unwrap_or(false)
            })
            .collect()
    }

    /// A plain connection to node `index`, for commands to that node alone.
    fn node_connection(&self, index: usize) -> redis::Connection {
        self.nodes[index]
            .client()
            .get_connection()
            .unwrap_or_else(|e| panic!("connect to cluster node {index}: {e}"))
    }

    /// The hash slot of `key`, as the cluster computes it.
    pub fn keyslot(&self, key: &str) -> u16 {
        redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query(&mut self.node_connection(self.masters()[0]))
            .expect("CLUSTER KEYSLOT")
    }

    /// The index of the node serving `slot` now, as master `asked` sees it.
    pub fn slot_owner(&self, slot: u16, asked: usize) -> usize {
        let ranges: Vec<redis::Value> = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query(&mut self.node_connection(asked))
            .expect("CLUSTER SLOTS");
        for range in ranges {
            let redis::Value::Array(fields) = range else {
                continue;
            };
            let number = |v: &redis::Value| redis::from_redis_value_ref::<u16>(v).ok();
            let (Some(start), Some(end)) = (number(&fields[0]), number(&fields[1])) else {
                continue;
            };
            let redis::Value::Array(master) = &fields[2] else {
                continue;
            };
            if (start..=end).contains(&slot) {
                let port = number(&master[1]).expect("a master's port");
                return self
                    .nodes
                    .iter()
                    .position(|n| n.port() == port)
                    .expect("a node of this cluster");
            }
        }
        panic!("no master serves slot {slot}")
    }

    /// Whether node `index` holds `key` (asked of that node alone).
    pub fn holds(&self, index: usize, key: &str) -> bool {
        redis::cmd("EXISTS")
            .arg(key)
            .query::<i64>(&mut self.node_connection(index))
            .map(|n| n == 1)
            .unwrap_or(false)
    }

    fn node_id(&self, index: usize) -> String {
        redis::cmd("CLUSTER")
            .arg("MYID")
            .query(&mut self.node_connection(index))
            .expect("CLUSTER MYID")
    }

    fn set_slot(&self, slot: u16, index: usize, state: &str, node: &str) {
        let _: () = redis::cmd("CLUSTER")
            .arg("SETSLOT")
            .arg(slot)
            .arg(state)
            .arg(node)
            .query(&mut self.node_connection(index))
            .unwrap_or_else(|e| panic!("CLUSTER SETSLOT {slot} {state} on node {index}: {e}"));
    }

    /// Marks `slot` importing on master `to` and migrating on master `from`,
    /// where its keys stay: the first step of a move.
    pub fn start_moving_slot(&self, slot: u16, from: usize, to: usize) {
        self.set_slot(slot, to, "IMPORTING", &self.node_id(from));
        self.set_slot(slot, from, "MIGRATING", &self.node_id(to));
    }

    /// Moves `slot` from master `from` to master `to` by hand, as
    /// `redis-cli --cluster reshard` does: mark it importing and migrating,
    /// `MIGRATE` its keys one at a time with `pause` between them (so that
    /// calls meet the slot half moved), then assign it to `to` everywhere.
    pub fn move_slot(&self, slot: u16, from: usize, to: usize, pause: Duration) {
        self.start_moving_slot(slot, from, to);
        std::thread::sleep(pause);
        let mut source = self.node_connection(from);
        loop {
            let keys: Vec<String> = redis::cmd("CLUSTER")
                .arg("GETKEYSINSLOT")
                .arg(slot)
                .arg(1)
                .query(&mut source)
                .expect("CLUSTER GETKEYSINSLOT");
            let Some(key) = keys.first() else { break };
            let _: redis::Value = redis::cmd("MIGRATE")
                .arg("127.0.0.1")
                .arg(self.nodes[to].port())
                .arg(key)
                .arg(0)
                .arg(5000)
                .query(&mut source)
                .unwrap_or_else(|e| panic!("MIGRATE {key}: {e}"));
            std::thread::sleep(pause);
        }
        let to_id = self.node_id(to);
        self.set_slot(slot, to, "NODE", &to_id);
        self.set_slot(slot, from, "NODE", &to_id);
        for master in self.masters() {
            if master != from && master != to {
                self.set_slot(slot, master, "NODE", &to_id);
            }
        }
    }

    /// Keys stored on node `index`.
    pub fn dbsize(&self, index: usize) -> i64 {
        self.nodes[index]
            .client()
            .get_connection()
            .and_then(|mut c| redis::cmd("DBSIZE").query(&mut c))
            .unwrap_or(-1)
    }
}

/// A private CA, a server certificate for 127.0.0.1 and localhost, and a
/// client certificate, all made for one test, as PEM files in a temp dir.
pub struct TlsFiles {
    dir: tempfile::TempDir,
}

impl TlsFiles {
    pub fn generate() -> Self {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
        let dir = tempfile::tempdir().expect("a temp dir for certificates");
        // Each certificate its own subject: one equal to its issuer's looks
        // self-signed to OpenSSL, which then refuses it.
        let params = |names: Vec<String>, subject: &str| {
            let mut params = CertificateParams::new(names).unwrap();
            params.distinguished_name.push(DnType::CommonName, subject);
            params
        };
        let mut ca_params = params(Vec::new(), "ratelimit test CA");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca_key = KeyPair::generate().unwrap();
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca_params, ca_key);
        let server_key = KeyPair::generate().unwrap();
        let server = params(
            vec!["127.0.0.1".to_owned(), "localhost".to_owned()],
            "127.0.0.1",
        )
        .signed_by(&server_key, &issuer)
        .unwrap();
        let client_key = KeyPair::generate().unwrap();
        let client = params(Vec::new(), "ratelimit test client")
            .signed_by(&client_key, &issuer)
            .unwrap();
        let files = TlsFiles { dir };
        for (name, pem) in [
            ("ca.pem", ca.pem()),
            ("server.pem", server.pem()),
            ("server.key", server_key.serialize_pem()),
            ("client.pem", client.pem()),
            ("client.key", client_key.serialize_pem()),
        ] {
            std::fs::write(files.dir.path().join(name), pem).expect("write a certificate");
        }
        files
    }

    pub fn path(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }

    pub fn read(&self, name: &str) -> Vec<u8> {
        std::fs::read(self.dir.path().join(name)).expect("read a certificate")
    }
}

/// Log lines written while `work` runs on this thread.
pub async fn logged<F: std::future::Future>(work: F) -> (F::Output, String) {
    logged_with(|_| work).await
}

/// What `logged_with`'s work has logged so far.
#[derive(Clone)]
pub struct Logs(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl Logs {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl std::io::Write for Logs {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// As `logged`, with `work` made from a view of the log so far, so that it
/// can wait for a line rather than for a guessed time.
pub async fn logged_with<F, Fut>(work: F) -> (Fut::Output, String)
where
    F: FnOnce(Logs) -> Fut,
    Fut: std::future::Future,
{
    let logs = Logs(std::sync::Arc::default());
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter("ratelimit=info")
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let output = {
        let _default = tracing::subscriber::set_default(subscriber);
        work(logs.clone()).await
    };
    (output, logs.text())
}

/// Clients of the server `connection` goes to, besides that one: the
/// limiter's, in a test whose only other connection it is.
pub async fn other_clients(connection: &mut redis::aio::MultiplexedConnection) -> usize {
    let list: String = redis::cmd("CLIENT")
        .arg(&["LIST", "TYPE", "normal"])
        .query_async(connection)
        .await
        .unwrap();
    list.lines().count().saturating_sub(1)
}

/// Closes every client of the server `connection` goes to but that one, as
/// `CLIENT KILL` (or the server's idle `timeout`) does; how many it closed.
pub async fn kill_other_clients(connection: &mut redis::aio::MultiplexedConnection) -> usize {
    let killed: i64 = redis::cmd("CLIENT")
        .arg(&["KILL", "TYPE", "normal", "SKIPME", "yes"])
        .query_async(connection)
        .await
        .unwrap();
    usize::try_from(killed).unwrap()
}

/// Waits until the server `connection` goes to has `clients` other clients
/// again, or `deadline` passes.
pub async fn await_other_clients(
    connection: &mut redis::aio::MultiplexedConnection,
    clients: usize,
    deadline: std::time::Instant,
) {
    while other_clients(connection).await < clients && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The denials of `count` checks of fresh keys under `prefix`, made one
/// after the other, as text.
pub async fn failed_checks(
    limiter: &ratelimit::Limiter,
    quota: &ratelimit::Quota,
    prefix: &str,
    count: usize,
) -> Vec<String> {
    let mut failed = Vec::new();
    for i in 0..count {
        let key = format!("{prefix}:{i}");
        if let Err(denied) = limiter.check(ratelimit::Request::new(quota, &key)).await {
            failed.push(denied.to_string());
        }
    }
    failed
}

/// What a check gave one request, denials by the quota included, as a plain
/// value: Redis, the memory backend and the deny cache are compared field by
/// field through it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decided {
    pub allowed: bool,
    pub limit: u64,
    pub remaining: u64,
    pub retry_after: Duration,
    pub reset_after: Duration,
    pub delay: Duration,
    pub fallback: bool,
}

impl From<&ratelimit::Decision> for Decided {
    fn from(d: &ratelimit::Decision) -> Self {
        Decided {
            allowed: d.allowed,
            limit: d.limit,
            remaining: d.remaining,
            retry_after: d.retry_after,
            reset_after: d.reset_after,
            delay: d.delay,
            fallback: d.fallback,
        }
    }
}

impl From<ratelimit::Decision> for Decided {
    fn from(d: ratelimit::Decision) -> Self {
        Decided::from(&d)
    }
}

impl From<&ratelimit::RateLimited> for Decided {
    fn from(denied: &ratelimit::RateLimited) -> Self {
        Decided {
            allowed: false,
            limit: denied.limit,
            remaining: denied.remaining,
            retry_after: denied.retry_after,
            reset_after: denied.reset_after,
            delay: Duration::ZERO,
            fallback: false,
        }
    }
}

/// The tests' shorthands over [`ratelimit::Limiter::check`], failing closed
/// so that a backend fault is never taken for an answer.
#[allow(async_fn_in_trait)]
pub trait Decide {
    /// `cost` of `quota` from `key`: admitted, or denied by the quota, is
    /// `Ok`; any other denial (a backend fault, failing closed, with its
    /// kind; a cost above the capacity) is `Err`.
    async fn decide(
        &self,
        quota: &ratelimit::Quota,
        key: &str,
        cost: u64,
    ) -> Result<Decided, ratelimit::RateLimited>;

    /// Several requests, all or nothing, failing closed: each one's decision
    /// when all admit, else the denial.
    async fn decide_all(
        &self,
        requests: &[ratelimit::Request<'_>],
    ) -> Result<Vec<Decided>, ratelimit::RateLimited>;
}

impl Decide for ratelimit::Limiter {
    async fn decide(
        &self,
        quota: &ratelimit::Quota,
        key: &str,
        cost: u64,
    ) -> Result<Decided, ratelimit::RateLimited> {
        let request = ratelimit::Request::new(quota, key)
            .cost(cost)
            .on_error(ratelimit::FailurePolicy::Closed);
        match self.check(request).await {
            Ok(admitted) => Ok(Decided::from(&admitted.decisions()[0])),
            Err(denied) if denied.cause == ratelimit::DenialCause::Quota => {
                Ok(Decided::from(&denied))
            }
            Err(denied) => Err(denied),
        }
    }

    async fn decide_all(
        &self,
        requests: &[ratelimit::Request<'_>],
    ) -> Result<Vec<Decided>, ratelimit::RateLimited> {
        let closed: Vec<ratelimit::Request<'_>> = requests
            .iter()
            .map(|r| r.on_error(ratelimit::FailurePolicy::Closed))
            .collect();
        let admitted = self.check(&closed[..]).await?;
        Ok(admitted.decisions().iter().map(Decided::from).collect())
    }
}

/// The kind of backend fault a closed denial names, if it is one.
pub fn fault(denied: &ratelimit::RateLimited) -> Option<ratelimit::ErrorKind> {
    match denied.cause {
        ratelimit::DenialCause::BackendUnavailable { kind } => Some(kind),
        _ => None,
    }
}

/// A quota of a bucket algorithm: `capacity` refilled at `rate` ("2/s").
#[allow(dead_code)]
pub fn bucket(algorithm: ratelimit::Algorithm, capacity: u64, rate: &str) -> ratelimit::Quota {
    ratelimit::Quota::builder(algorithm)
        .capacity(capacity)
        .rate(rate.parse().expect("a rate"))
        .build()
        .expect("a bucket quota")
}

/// A quota of a window algorithm: `limit` per `window` ("1s").
#[allow(dead_code)]
pub fn window(algorithm: ratelimit::Algorithm, limit: u64, window: &str) -> ratelimit::Quota {
    ratelimit::Quota::builder(algorithm)
        .limit(limit)
        .window(ratelimit::Quota::parse_window(window).expect("a window"))
        .build()
        .expect("a window quota")
}

/// The native module (`ratelimit-module`), built for these tests:
/// `RATELIMIT_MODULE` when set (`scripts/test` builds it and sets it), else
/// built here once, with `cargo build -p ratelimit-module` in a target
/// directory of its own (the one running the tests is locked). Fails with
/// what to install when it cannot be built.
pub fn native_module() -> PathBuf {
    static MODULE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    MODULE
        .get_or_init(|| {
            if let Some(path) = std::env::var_os("RATELIMIT_MODULE") {
                let path = PathBuf::from(path);
                assert!(
                    path.exists(),
                    "RATELIMIT_MODULE names {}, which does not exist",
                    path.display()
                );
                return path;
            }
            let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
            let target = workspace.join("target").join("module");
            let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
            let out = Command::new(cargo)
                .args(["build", "--quiet", "-p", "ratelimit-module"])
                .env("CARGO_TARGET_DIR", &target)
                .current_dir(&workspace)
                .output()
                .expect("run cargo to build the native module");
            assert!(
                out.status.success(),
                "`cargo build -p ratelimit-module` failed; bindgen needs libclang \
                 (Debian/Ubuntu: `apt-get install libclang-dev`):\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
            target.join("debug").join("libratelimit_module.so")
        })
        .clone()
}

/// A TCP relay on loopback, as a DNS name or a proxy in front of Redis is:
/// each connection it accepts goes to the port it leads to at that moment;
/// [`lead_to`](Relay::lead_to) changes that for the connections that come
/// after, and the ones open stay where they are until [`cut`](Relay::cut).
#[allow(dead_code)]
pub struct Relay {
    port: u16,
    target: std::sync::Arc<std::sync::atomic::AtomicU16>,
    /// How long each reply is held on its way back, in milliseconds.
    delay: std::sync::Arc<std::sync::atomic::AtomicU64>,
    accepted: std::sync::Arc<std::sync::atomic::AtomicU64>,
    cuts: tokio::sync::watch::Sender<u64>,
    accepting: tokio::task::JoinHandle<()>,
}

#[allow(dead_code)]
impl Relay {
    pub async fn start(target: u16) -> Self {
        use std::sync::atomic::Ordering::SeqCst;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the relay on loopback");
        let port = listener.local_addr().unwrap().port();
        let target = std::sync::Arc::new(std::sync::atomic::AtomicU16::new(target));
        let accepted = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let (cuts, cut) = tokio::sync::watch::channel(0);
        let delay = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let (leads, counted, held) = (target.clone(), accepted.clone(), delay.clone());
        let accepting = tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                counted.fetch_add(1, SeqCst);
                let port = leads.load(SeqCst);
                let mut cut = cut.clone();
                cut.borrow_and_update();
                let held = held.clone();
                tokio::spawn(async move {
                    if let Ok(outbound) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await
                    {
                        tokio::select! {
                            _ = relay(inbound, outbound, held) => {}
                            _ = cut.changed() => {}
                        }
                    }
                });
            }
        });
        Relay {
            port,
            target,
            delay,
            accepted,
            cuts,
            accepting,
        }
    }

    /// The relay's URL.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Sends the connections accepted from now on to `port`.
    pub fn lead_to(&self, port: u16) {
        self.target.store(port, std::sync::atomic::Ordering::SeqCst);
    }

    /// Closes every connection open through the relay.
    pub fn cut(&self) {
        self.cuts.send_modify(|n| *n += 1);
    }

    /// Holds every reply `delay` on its way back from now on, as a slow
    /// network would (each reply delayed from when it arrived, not queued
    /// behind the delays of those before it).
    pub fn delay_replies(&self, delay: Duration) {
        let ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        self.delay.store(ms, std::sync::atomic::Ordering::SeqCst);
    }

    /// The connections accepted so far.
    pub fn accepted(&self) -> u64 {
        self.accepted.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// Copies bytes both ways between `inbound` and `outbound` until either
/// side closes, holding the replies `delay` milliseconds.
async fn relay(
    inbound: tokio::net::TcpStream,
    outbound: tokio::net::TcpStream,
    delay: std::sync::Arc<std::sync::atomic::AtomicU64>,
) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let (mut from_client, mut to_client) = inbound.into_split();
    let (mut from_server, mut to_server) = outbound.into_split();
    let (replies, mut held) = tokio::sync::mpsc::unbounded_channel();
    let read = async move {
        let mut buffer = vec![0u8; 16 * 1024];
        while let Ok(n @ 1..) = from_server.read(&mut buffer).await {
            let ms = delay.load(std::sync::atomic::Ordering::SeqCst);
            let due = tokio::time::Instant::now() + Duration::from_millis(ms);
            if replies.send((due, buffer[..n].to_vec())).is_err() {
                break;
            }
        }
    };
    let write = async move {
        while let Some((due, bytes)) = held.recv().await {
            tokio::time::sleep_until(due).await;
            if to_client.write_all(&bytes).await.is_err() {
                break;
            }
        }
    };
    tokio::select! {
        _ = tokio::io::copy(&mut from_client, &mut to_server) => {}
        _ = async { tokio::join!(read, write) } => {}
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.accepting.abort();
        self.cut();
    }
}

/// `CONFIG SET name value` on `connection`.
#[allow(dead_code)]
pub async fn config_set(
    connection: &mut impl redis::aio::ConnectionLike,
    name: impl redis::ToRedisArgs,
    value: impl redis::ToRedisArgs,
) {
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg(name)
        .arg(value)
        .query_async(connection)
        .await
        .expect("CONFIG SET");
}

/// Waits until `source` has read the rules, at most `within`; `what`
/// says what failed otherwise.
pub async fn read_rules(source: &ratelimit::RedisRuleSource, within: Duration, what: &str) {
    tokio::time::timeout(within, source.ready())
        .await
        .unwrap_or_else(|_| panic!("{what}"))
        .unwrap_or_else(|error| panic!("{what}: {error}"));
}

/// The name Sentinels of a test give their master.
pub const SENTINEL_MASTER: &str = "rl-master";
const MASTER: &str = SENTINEL_MASTER;

/// `SENTINEL <args>` asked of `sentinel`; nil when it cannot answer.
pub fn sentinel_command(sentinel: &RedisServer, args: &[&str]) -> redis::Value {
    let mut connection = sentinel
        .client()
        .get_connection_with_timeout(Duration::from_secs(1))
        .expect("connect to a sentinel");
    let mut cmd = redis::cmd("SENTINEL");
    for arg in args {
        cmd.arg(*arg);
    }
    cmd.query(&mut connection).unwrap_or(redis::Value::Nil)
}

/// The master's port as the Sentinels report it.
pub fn master_port(sentinel: &RedisServer) -> Option<u16> {
    match sentinel_command(sentinel, &["get-master-addr-by-name", MASTER]) {
        redis::Value::Array(parts) => match parts.get(1) {
            Some(redis::Value::BulkString(port)) => std::str::from_utf8(port).ok()?.parse().ok(),
            _ => None,
        },
        _ => None,
    }
}

pub fn wait_for(what: &str, within: Duration, mut done: impl FnMut() -> bool) -> Duration {
    let started = Instant::now();
    while !done() {
        assert!(
            started.elapsed() < within,
            "{what} did not happen within {within:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    started.elapsed()
}

/// A master, its replica and three Sentinels that know both and each other.
pub fn sentinel_set() -> (RedisServer, RedisServer, Vec<RedisServer>) {
    sentinel_set_with(&[], &[], None)
}

/// A master started with `on_master` arguments, its replica started with
/// `on_replica`, and three Sentinels watching them; all of them serving TLS
/// only, and replicating over it, with `tls`'s certificates when given.
pub fn sentinel_set_with(
    on_master: &[&str],
    on_replica: &[&str],
    tls: Option<&TlsFiles>,
) -> (RedisServer, RedisServer, Vec<RedisServer>) {
    let start = |args: &[&str]| match tls {
        Some(files) => RedisServer::start_tls_with(files, false, args),
        None => RedisServer::start_with(args),
    };
    let master = start(on_master);
    let master_port = master.port().to_string();
    let mut replica_args = vec!["--replicaof", "127.0.0.1", master_port.as_str()];
    if tls.is_some() {
        replica_args.extend_from_slice(&["--tls-replication", "yes"]);
    }
    replica_args.extend_from_slice(on_replica);
    let replica = start(&replica_args);
    let sentinels: Vec<RedisServer> = (0..3)
        .map(|_| RedisServer::start_sentinel(MASTER, master.port(), tls))
        .collect();
    // The Sentinels learn of the replica and of each other from the master.
    wait_for(
        "the Sentinels' discovery of the replica",
        Duration::from_secs(20),
        || {
            sentinels.iter().all(|s| {
            matches!(sentinel_command(s, &["replicas", MASTER]), redis::Value::Array(r) if !r.is_empty())
        }) && matches!(
            sentinel_command(&sentinels[0], &["sentinels", MASTER]),
            redis::Value::Array(others) if others.len() == 2
        )
        },
    );
    (master, replica, sentinels)
}
