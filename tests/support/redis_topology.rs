//! Redis topologies of the tests' own, on free loopback ports, each node in
//! a temporary directory and killed when dropped: a three-primary Redis
//! Cluster (`redis-server --cluster-enabled yes`, `redis-cli --cluster
//! create`), and a primary with a replica and three sentinels
//! (`redis-server --sentinel`).
//!
//! They need `redis-server` and `redis-cli` on `PATH` (Debian:
//! `apt-get install redis-server redis-tools`); without them, `start`
//! returns `None` and the test says it is skipped (it fails instead with
//! `TOWER_INFLIGHT_REQUIRE_REDIS` set, as `.ci/run` sets it).

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Generous: the tests run on loaded two-core machines.
const STARTUP: Duration = Duration::from_secs(60);

/// Whether `program` runs; if not, says the test is skipped.
pub(crate) fn available(program: &str, test: &str) -> bool {
    let runs = Command::new(program)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success());
    if !runs && std::env::var_os("TOWER_INFLIGHT_REQUIRE_REDIS").is_some() {
        panic!("{test}: `{program}` is not on PATH, and TOWER_INFLIGHT_REQUIRE_REDIS is set");
    }
    if !runs {
        eprintln!(
            "SKIPPED {test}: `{program}` is not on PATH (Debian: \
             `apt-get install redis-server redis-tools`)"
        );
    }
    runs
}

/// A free loopback port; with `bus`, one whose port + 10000 (a cluster
/// node's bus) is free too.
pub(crate) fn free_port(bus: bool) -> u16 {
    loop {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a free port");
        let port = listener.local_addr().unwrap().port();
        if !bus {
            return port;
        }
        if port < 55_000 && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
}

fn temp_dir(what: &str, port: u16) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "tower-inflight-{what}-{}-{port}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// One `redis-server` process (a node or a sentinel), killed when dropped.
pub(crate) struct Node {
    pub(crate) port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

impl Node {
    fn spawn(port: u16, dir: PathBuf, args: &[String]) -> Self {
        let child = Command::new("redis-server")
            .args(args)
            .current_dir(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server starts");
        let node = Self {
            port,
            dir,
            child: Some(child),
        };
        node.until_it_answers();
        node
    }

    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    pub(crate) fn client(&self) -> redis::Client {
        redis::Client::open(self.url()).unwrap()
    }

    /// A command of the test's own, on a connection of its own.
    pub(crate) fn command<T: redis::FromRedisValue>(&self, args: &[&str]) -> redis::RedisResult<T> {
        let mut connection = self
            .client()
            .get_connection_with_timeout(Duration::from_secs(5))?;
        connection.set_read_timeout(Some(Duration::from_secs(10)))?;
        let mut command = redis::cmd(args[0]);
        for arg in &args[1..] {
            command.arg(*arg);
        }
        command.query(&mut connection)
    }

    fn until_it_answers(&self) {
        let started = Instant::now();
        while self.command::<String>(&["PING"]).is_err() {
            assert!(
                started.elapsed() < STARTUP,
                "redis-server never answered on port {}",
                self.port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Freezes the process (SIGSTOP), as a stall or a network split would:
    /// connections stay open, commands go unanswered.
    pub(crate) fn freeze(&self) {
        self.signal("-STOP");
    }

    /// Thaws a frozen process (SIGCONT).
    pub(crate) fn thaw(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        let pid = self.child.as_ref().expect("running").id().to_string();
        let status = Command::new("kill").args([signal, &pid]).status().unwrap();
        assert!(status.success(), "kill {signal} {pid}");
    }

    /// Kills the process, as a crash would.
    pub(crate) fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Waits up to `STARTUP` for `done`, saying what it waited for if never.
fn until(what: &str, mut done: impl FnMut() -> bool) {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < STARTUP, "never: {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A Redis Cluster of three primaries, no replicas, every slot assigned.
pub(crate) struct RedisCluster {
    pub(crate) nodes: Vec<Node>,
}

impl RedisCluster {
    pub(crate) fn start(test: &str) -> Option<Self> {
        if !available("redis-server", test) || !available("redis-cli", test) {
            return None;
        }
        let nodes: Vec<Node> = (0..3)
            .map(|_| {
                let port = free_port(true);
                let dir = temp_dir("cluster", port);
                let args = [
                    "--port",
                    &port.to_string(),
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "5000",
                ]
                .map(String::from);
                Node::spawn(port, dir, &args)
            })
            .collect();
        let status = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(nodes.iter().map(|node| format!("127.0.0.1:{}", node.port)))
            .arg("--cluster-yes")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("redis-cli runs");
        assert!(status.success(), "redis-cli --cluster create failed");
        let cluster = Self { nodes };
        for node in &cluster.nodes {
            until("every node sees the cluster ok", || {
                node.command::<String>(&["CLUSTER", "INFO"])
                    .is_ok_and(|info| info.contains("cluster_state:ok"))
            });
        }
        Some(cluster)
    }

    pub(crate) fn client(&self) -> redis::cluster::ClusterClient {
        redis::cluster::ClusterClient::new(self.nodes.iter().map(Node::url).collect::<Vec<_>>())
            .unwrap()
    }

    pub(crate) fn id(&self, node: usize) -> String {
        self.nodes[node].command(&["CLUSTER", "MYID"]).unwrap()
    }

    pub(crate) fn slot(&self, key: &str) -> u16 {
        self.nodes[0].command(&["CLUSTER", "KEYSLOT", key]).unwrap()
    }

    /// Which node owns `slot`, as node 0 sees it.
    pub(crate) fn owner(&self, slot: u16) -> usize {
        let slots: redis::Value = self.nodes[0].command(&["CLUSTER", "SLOTS"]).unwrap();
        let redis::Value::Array(ranges) = slots else {
            panic!("CLUSTER SLOTS: {slots:?}")
        };
        for range in ranges {
            let (from, to, port): (u16, u16, (String, u16)) = match range {
                redis::Value::Array(parts) => (
                    redis::from_redis_value(parts[0].clone()).unwrap(),
                    redis::from_redis_value(parts[1].clone()).unwrap(),
                    redis::from_redis_value(match &parts[2] {
                        redis::Value::Array(primary) => redis::Value::Array(primary[..2].to_vec()),
                        other => panic!("CLUSTER SLOTS primary: {other:?}"),
                    })
                    .unwrap(),
                ),
                other => panic!("CLUSTER SLOTS range: {other:?}"),
            };
            if (from..=to).contains(&slot) {
                return self
                    .nodes
                    .iter()
                    .position(|node| node.port == port.1)
                    .unwrap();
            }
        }
        panic!("slot {slot} unassigned");
    }

    /// How many times `command` (lower case, as `INFO commandstats` names
    /// it) ran on `node`.
    pub(crate) fn calls(&self, node: usize, command: &str) -> u64 {
        let info: String = self.nodes[node].command(&["INFO", "commandstats"]).unwrap();
        stat(&info, &format!("cmdstat_{command}:calls="))
    }

    /// How many error replies with this prefix (`MOVED`, `ASK`) `node`
    /// gave.
    pub(crate) fn errors(&self, node: usize, prefix: &str) -> u64 {
        let info: String = self.nodes[node].command(&["INFO", "errorstats"]).unwrap();
        stat(&info, &format!("errorstat_{prefix}:count="))
    }

    /// Moves `slot` from node `from` to node `to` as `redis-cli --cluster
    /// reshard` does, pausing `pause` in each stage so that clients meet
    /// it: IMPORTING on the target and MIGRATING on the source (the
    /// source still serves the keys it has, and answers `ASK` for the
    /// others); the keys moved by `MIGRATE` (every command on them now
    /// `ASK`-redirected); then the slot given to the target everywhere
    /// (`MOVED` from the source).
    pub(crate) fn migrate(&self, slot: u16, from: usize, to: usize, pause: Duration) {
        let slot = slot.to_string();
        let (source, target) = (self.id(from), self.id(to));
        let ok = |node: usize, args: &[&str]| {
            let reply: String = self.nodes[node].command(args).unwrap();
            assert_eq!(reply, "OK", "{args:?}");
        };
        ok(to, &["CLUSTER", "SETSLOT", &slot, "IMPORTING", &source]);
        ok(from, &["CLUSTER", "SETSLOT", &slot, "MIGRATING", &target]);
        std::thread::sleep(pause);
        let to_port = self.nodes[to].port.to_string();
        loop {
            let keys: Vec<String> = self.nodes[from]
                .command(&["CLUSTER", "GETKEYSINSLOT", &slot, "100"])
                .unwrap();
            if keys.is_empty() {
                break;
            }
            let mut args = vec!["MIGRATE", "127.0.0.1", &to_port, "", "0", "5000", "KEYS"];
            args.extend(keys.iter().map(String::as_str));
            // "NOKEY" if a key went (its last lease released) meanwhile.
            let _: redis::Value = self.nodes[from].command(&args).unwrap();
        }
        std::thread::sleep(pause);
        ok(to, &["CLUSTER", "SETSLOT", &slot, "NODE", &target]);
        ok(from, &["CLUSTER", "SETSLOT", &slot, "NODE", &target]);
        for other in (0..self.nodes.len()).filter(|&node| node != from && node != to) {
            ok(other, &["CLUSTER", "SETSLOT", &slot, "NODE", &target]);
        }
    }
}

fn stat(info: &str, prefix: &str) -> u64 {
    info.lines()
        .find_map(|line| line.strip_prefix(prefix))
        .map_or(0, |rest| {
            rest.split(',').next().unwrap().trim().parse().unwrap()
        })
}

/// A primary with one replica, watched by three sentinels (quorum 2) as
/// `mymaster`, which they call down after a second.
pub(crate) struct RedisSentinel {
    pub(crate) primary: Node,
    pub(crate) replica: Node,
    pub(crate) sentinels: Vec<Node>,
}

pub(crate) const PRIMARY_NAME: &str = "mymaster";

impl RedisSentinel {
    pub(crate) fn start(test: &str) -> Option<Self> {
        if !available("redis-server", test) {
            return None;
        }
        let data = |port: u16| {
            [
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ]
            .map(String::from)
            .to_vec()
        };
        let port = free_port(false);
        let primary = Node::spawn(port, temp_dir("primary", port), &data(port));
        let port = free_port(false);
        let mut args = data(port);
        args.extend([
            "--replicaof".into(),
            "127.0.0.1".into(),
            primary.port.to_string(),
        ]);
        let replica = Node::spawn(port, temp_dir("replica", port), &args);
        until("the replica in sync", || {
            replica
                .command::<String>(&["INFO", "replication"])
                .is_ok_and(|info| info.contains("master_link_status:up"))
        });
        let sentinels: Vec<Node> = (0..3)
            .map(|_| {
                let port = free_port(false);
                let dir = temp_dir("sentinel", port);
                // Sentinel rewrites its configuration file: one per sentinel.
                let config = dir.join("sentinel.conf");
                std::fs::write(
                    &config,
                    format!(
                        "port {port}\nbind 127.0.0.1\ndir {dir}\n\
                         sentinel monitor {PRIMARY_NAME} 127.0.0.1 {primary} 2\n\
                         sentinel down-after-milliseconds {PRIMARY_NAME} 1000\n\
                         sentinel failover-timeout {PRIMARY_NAME} 10000\n\
                         sentinel parallel-syncs {PRIMARY_NAME} 1\n",
                        dir = dir.display(),
                        primary = primary.port,
                    ),
                )
                .unwrap();
                let args = [config.display().to_string(), "--sentinel".into()];
                Node::spawn(port, dir, &args)
            })
            .collect();
        let topology = Self {
            primary,
            replica,
            sentinels,
        };
        for sentinel in &topology.sentinels {
            until(
                "each sentinel knows the replica and the other sentinels",
                || {
                    let replicas: redis::RedisResult<Vec<redis::Value>> =
                        sentinel.command(&["SENTINEL", "REPLICAS", PRIMARY_NAME]);
                    let others: redis::RedisResult<Vec<redis::Value>> =
                        sentinel.command(&["SENTINEL", "SENTINELS", PRIMARY_NAME]);
                    replicas.is_ok_and(|replicas| replicas.len() == 1)
                        && others.is_ok_and(|others| others.len() == 2)
                },
            );
        }
        Some(topology)
    }

    /// The sentinels' addresses, as a client is given them.
    pub(crate) fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels.iter().map(Node::url).collect()
    }

    /// The primary's port, as the first sentinel that answers names it.
    pub(crate) fn primary_port(&self) -> Option<u16> {
        self.sentinels.iter().find_map(|sentinel| {
            sentinel
                .command::<(String, u16)>(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", PRIMARY_NAME])
                .ok()
                .map(|(_, port)| port)
        })
    }
}
