//! Where a ceiling's leases live, and the connection to them: one Redis
//! node (or a primary with replicas behind one address), a Redis Cluster,
//! or the primary that Sentinel names.
//!
//! Each kind is made lazily in the current runtime and mends itself: the
//! single node's `ConnectionManager` reconnects to its address; the
//! cluster's connection follows `MOVED` and `ASK` and refreshes its slots;
//! the Sentinel connection asks the sentinels for the primary again once
//! the one it had fails (an I/O error, a `READONLY` reply from a primary
//! demoted to a replica, or a command left unanswered past its timeout).

use ::redis::aio::MultiplexedConnection;
use ::redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use ::redis::cluster::{ClusterClient, ClusterConfig};
use ::redis::cluster_async::ClusterConnection;
use ::redis::cluster_routing::SingleNodeRoutingInfo;
use ::redis::sentinel::SentinelClient;
use ::redis::RedisFuture;
use ::redis::{AsyncConnectionConfig, Cmd, ErrorKind, Pipeline, RedisError, RedisResult};
use ::redis::{ServerErrorKind, Value};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// Where the leases live: what a [`ClusterCeiling`](super::ClusterCeiling)
/// was built from.
#[derive(Clone)]
pub(super) enum Store {
    /// One address: a node, or a primary with its replicas.
    Node(::redis::Client),
    /// A Redis Cluster: the ceiling's one key lives in one slot.
    Cluster(Box<ClusterClient>),
    /// The primary that Sentinel names, found again after a failover.
    Sentinel(Arc<tokio::sync::Mutex<SentinelClient>>),
}

impl Store {
    /// A connection made lazily, in the current runtime, on the first
    /// command: each command it sends times out after `timeout`, as does
    /// making it.
    pub(super) fn connect(&self, timeout: Duration) -> RedisResult<Connection> {
        Ok(match self {
            Store::Node(client) => {
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(timeout))
                    .set_response_timeout(Some(timeout))
                    .set_number_of_retries(1);
                Connection::Node(ConnectionManager::new_lazy_with_config(
                    client.clone(),
                    config,
                )?)
            }
            Store::Cluster(client) => {
                let config = ClusterConfig::new()
                    .set_connection_timeout(timeout)
                    .set_response_timeout(timeout);
                Connection::Cluster(client.get_pending_async_connection_with_config(config))
            }
            Store::Sentinel(sentinel) => Connection::Sentinel(SentinelConnection {
                shared: Arc::new(SentinelShared {
                    sentinel: sentinel.clone(),
                    timeout,
                    primary: Mutex::new(None),
                    connecting: tokio::sync::Mutex::new(0),
                }),
            }),
        })
    }
}

/// A connection to where the leases live, cheap to clone.
#[derive(Clone)]
pub(super) enum Connection {
    Node(ConnectionManager),
    Cluster(ClusterConnection),
    Sentinel(SentinelConnection),
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Connection::Node(connection) => connection.req_packed_command(cmd),
            Connection::Cluster(connection) => Box::pin(async move {
                match connection.req_packed_command(cmd).await {
                    Err(error) if error.kind() == ErrorKind::Server(ServerErrorKind::Ask) => {
                        asking(connection, cmd, error).await
                    }
                    answer => answer,
                }
            }),
            Connection::Sentinel(connection) => connection.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Connection::Node(connection) => connection.req_packed_commands(pipeline, offset, count),
            Connection::Cluster(connection) => {
                connection.req_packed_commands(pipeline, offset, count)
            }
            Connection::Sentinel(connection) => {
                connection.req_packed_commands(pipeline, offset, count)
            }
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Connection::Node(connection) => connection.get_db(),
            Connection::Cluster(connection) => connection.get_db(),
            Connection::Sentinel(_) => 0,
        }
    }
}

/// `cmd` sent once more to the node an `ASK` redirection named, with
/// `ASKING` before it in one pipeline, so that nothing comes between them.
///
/// The cluster connection follows `ASK` itself, but sends `ASKING` and the
/// command apart on a connection that concurrent requests share: another
/// request's command can spend the `ASKING`, and this one, refused by the
/// target (`MOVED` back to the source, which answers `ASK` again), bounces
/// until its retries run out. This is its last try.
async fn asking(
    connection: &mut ClusterConnection,
    cmd: &Cmd,
    ask: RedisError,
) -> RedisResult<Value> {
    let Some((host, port)) = ask
        .redirect_node()
        .and_then(|(node, _slot)| node.rsplit_once(':'))
        .and_then(|(host, port)| Some((host.to_owned(), port.parse().ok()?)))
    else {
        return Err(ask);
    };
    let mut pipeline = ::redis::pipe();
    pipeline.cmd("ASKING").ignore().add_command(cmd.clone());
    let route = SingleNodeRoutingInfo::ByAddress { host, port };
    let mut answers = connection.route_pipeline(pipeline, 1, 1, route).await?;
    answers.pop().ok_or(ask)
}

/// The primary that Sentinel names, asked for on the first command and
/// again after the connection to it fails.
#[derive(Clone)]
pub(super) struct SentinelConnection {
    shared: Arc<SentinelShared>,
}

struct SentinelShared {
    /// Shared by every bulkhead built from one ceiling: asking the
    /// sentinels takes it for a moment.
    sentinel: Arc<tokio::sync::Mutex<SentinelClient>>,
    timeout: Duration,
    /// The connection to the primary, with a number that tells it from the
    /// one made after it: a command that fails on an old connection does
    /// not drop a new one.
    primary: Mutex<Option<(u64, MultiplexedConnection)>>,
    /// One caller at a time asks the sentinels; the others wait for its
    /// answer (each within its own timeout).
    connecting: tokio::sync::Mutex<u64>,
}

impl SentinelShared {
    fn current(&self) -> Option<(u64, MultiplexedConnection)> {
        self.primary
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The connection to the primary: the one held, or one made now to
    /// the primary the sentinels name (which checks its role).
    async fn primary(&self) -> RedisResult<(u64, MultiplexedConnection)> {
        if let Some(current) = self.current() {
            return Ok(current);
        }
        let mut made = self.connecting.lock().await;
        if let Some(current) = self.current() {
            return Ok(current);
        }
        let client = self.sentinel.lock().await.async_get_client().await?;
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.timeout))
            .set_response_timeout(Some(self.timeout));
        let connection = client
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        *made += 1;
        let current = (*made, connection);
        *self.primary.lock().unwrap_or_else(PoisonError::into_inner) = Some(current.clone());
        Ok(current)
    }

    /// Drops connection `number` if it is still the one held: the next
    /// command asks the sentinels again.
    fn forget(&self, number: u64) {
        let mut primary = self.primary.lock().unwrap_or_else(PoisonError::into_inner);
        if primary.as_ref().is_some_and(|(held, _)| *held == number) {
            *primary = None;
        }
    }
}

/// Whether a command's failure says the connection no longer reaches the
/// primary: it broke or timed out (a primary killed, stalled or cut off),
/// or the server is a replica now. Other server errors (a script missing
/// from the cache, an out-of-memory answer) come from the primary itself.
fn lost_primary(error: &RedisError) -> bool {
    error.is_io_error()
        || error.is_timeout()
        || error.is_connection_dropped()
        || error.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly)
}

/// `answer`, from the primary reached on connection `number`: a failure
/// that says the primary is lost has the next command ask the sentinels.
fn checked<T>(shared: &SentinelShared, number: u64, answer: RedisResult<T>) -> RedisResult<T> {
    if answer.as_ref().is_err_and(lost_primary) {
        shared.forget(number);
    }
    answer
}

impl SentinelConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let (number, mut connection) = self.shared.primary().await?;
            let answer = connection.req_packed_command(cmd).await;
            checked(&self.shared, number, answer)
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let (number, mut connection) = self.shared.primary().await?;
            let answer = connection
                .req_packed_commands(pipeline, offset, count)
                .await;
            checked(&self.shared, number, answer)
        })
    }
}
