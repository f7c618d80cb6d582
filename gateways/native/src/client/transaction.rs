//! [`TransactionProducer`]: RocketMQ transactional messages. A half message is stored
//! invisible, the local transaction runs, and its outcome commits or rolls back the
//! message. When the outcome is unknown (or the producer died before telling), the broker
//! asks a producer of the group later (`CHECK_TRANSACTION_STATE`) and the check-back
//! listener decides.

use std::sync::Arc;

use rocketgate_core::store::record::{decode_msg_id, property};
use tokio::sync::mpsc;
use tracing::debug;

use super::ClientSettings;
use super::link::Pushed;
use super::message::{Message, SendResult};
use super::producer::Producer;
use super::session::Session;
use crate::Error;
use crate::message::ReceivedMessage;
use rocketgate_remoting::body::{field, transaction};
use rocketgate_remoting::code::request;
use rocketgate_remoting::codec::RemotingCommand;

/// The outcome of a local transaction, or of a check-back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransactionState {
    Commit,
    Rollback,
    /// Not decided yet: the broker will ask again later.
    Unknown,
}

impl TransactionState {
    fn wire(self) -> i32 {
        match self {
            TransactionState::Commit => transaction::COMMIT,
            TransactionState::Rollback => transaction::ROLLBACK,
            TransactionState::Unknown => transaction::NOT_TYPE,
        }
    }
}

type CheckListener = dyn Fn(&ReceivedMessage) -> TransactionState + Send + Sync;

/// A producer of transactional messages.
///
/// ```no_run
/// use rocketgate_native::client::{ClientSettings, Message, TransactionProducer, TransactionState};
///
/// # async fn demo() -> Result<(), rocketgate_native::Error> {
/// let producer = TransactionProducer::start(
///     ClientSettings::new(["127.0.0.1:9876"]),
///     "payments",
///     // Asked by the broker about transactions whose outcome it never heard.
///     |half| if half.keys().contains(&"paid-1") { TransactionState::Commit } else { TransactionState::Rollback },
/// )
/// .await?;
/// let (sent, state) = producer
///     .send_in_transaction(Message::new("payments", "charge").with_keys(["paid-1"]), |_sent| {
///         // ... write to the local database ...
///         TransactionState::Commit
///     })
///     .await?;
/// # Ok(()) }
/// ```
pub struct TransactionProducer {
    producer: Producer,
    session: Arc<Session>,
    group: String,
}

impl TransactionProducer {
    /// Starts a transactional producer of `group`; `check` answers the broker's
    /// check-backs of undecided transactions (it may be called on a blocking thread).
    pub async fn start(
        config: ClientSettings,
        group: impl Into<String>,
        check: impl Fn(&ReceivedMessage) -> TransactionState + Send + Sync + 'static,
    ) -> Result<TransactionProducer, Error> {
        let group = group.into();
        let (session, pushes) = Session::start(config);
        // Drain nothing here: check-backs are answered by our own task.
        let (_unused_tx, unused_rx) = mpsc::unbounded_channel();
        let producer = Producer::with_session(session.clone(), group.clone(), unused_rx);
        tokio::spawn(answer_checks(
            Arc::downgrade(&session),
            group.clone(),
            pushes,
            Arc::new(check),
        ));
        Ok(TransactionProducer {
            producer,
            session,
            group,
        })
    }

    /// Sends `msg` as a half message, runs `local` with where it was stored, and
    /// commits or rolls back by its answer (`Unknown`: left for the check-back).
    pub async fn send_in_transaction(
        &self,
        msg: Message,
        local: impl FnOnce(&SendResult) -> TransactionState,
    ) -> Result<(SendResult, TransactionState), Error> {
        // The broker must know us as a producer of the group to check back.
        if let Ok(()) = self.session.route(&msg.topic).await.map(drop) {
            let _ = self.session.heartbeat_now().await;
        }
        let msg = msg
            .with_property(property::TRANSACTION_PREPARED, "true")
            .with_property(property::PRODUCER_GROUP, &self.group);
        let sent = self.producer.send(msg).await?;
        let state = local(&sent);
        if state != TransactionState::Unknown {
            let addr = self
                .session
                .broker_addr(&sent.queue.broker_name)
                .ok_or_else(|| Error::NoRoute {
                    topic: sent.queue.topic.clone(),
                })?;
            let (_, commit_log_offset) =
                decode_msg_id(&sent.offset_msg_id).map_err(|e| Error::Protocol {
                    addr: addr.clone(),
                    what: format!("half message id {:?}: {e}", sent.offset_msg_id),
                })?;
            let cmd = end_command(
                &self.group,
                commit_log_offset,
                sent.queue_offset,
                &sent.msg_id,
                sent.transaction_id.as_deref().unwrap_or(&sent.msg_id),
                state,
                false,
            );
            self.session.links.oneway(&addr, cmd).await?;
        }
        Ok((sent, state))
    }

    /// Stops: leaves the group on every broker and closes the connections.
    pub async fn shutdown(self) {
        self.producer.shutdown().await;
    }
}

fn end_command(
    group: &str,
    commit_log_offset: u64,
    half_queue_offset: u64,
    msg_id: &str,
    transaction_id: &str,
    state: TransactionState,
    from_check: bool,
) -> RemotingCommand {
    RemotingCommand::request(request::END_TRANSACTION, 0)
        .with_field(field::PRODUCER_GROUP, group)
        .with_field(field::TRAN_STATE_TABLE_OFFSET, half_queue_offset)
        .with_field(field::COMMIT_LOG_OFFSET, commit_log_offset)
        .with_field(field::COMMIT_OR_ROLLBACK, state.wire())
        .with_field(field::FROM_TRANSACTION_CHECK, from_check)
        .with_field(field::MSG_ID, msg_id)
        .with_field(field::TRANSACTION_ID, transaction_id)
}

/// Answers `CHECK_TRANSACTION_STATE` pushes with the listener's verdict.
async fn answer_checks(
    session: std::sync::Weak<Session>,
    group: String,
    mut pushes: mpsc::UnboundedReceiver<Pushed>,
    check: Arc<CheckListener>,
) {
    while let Some(Pushed { addr, command }) = pushes.recv().await {
        if command.code != request::CHECK_TRANSACTION_STATE {
            continue;
        }
        let Some(session) = session.upgrade() else {
            return;
        };
        let num = |name: &str| command.field(name).and_then(|v| v.parse::<u64>().ok());
        let (Some(commit_log_offset), Some(half_offset)) = (
            num(field::COMMIT_LOG_OFFSET),
            num(field::TRAN_STATE_TABLE_OFFSET),
        ) else {
            debug!(%addr, "check-back without offsets; ignored");
            continue;
        };
        let half = match ReceivedMessage::from_record(&command.body) {
            Ok((m, _)) => m,
            Err(e) => {
                debug!(%addr, error = %e, "check-back with a malformed record; ignored");
                continue;
            }
        };
        let msg_id = command
            .field(field::MSG_ID)
            .unwrap_or(&half.msg_id)
            .to_owned();
        let transaction_id = command
            .field(field::TRANSACTION_ID)
            .unwrap_or(&msg_id)
            .to_owned();
        let check = check.clone();
        let group = group.clone();
        tokio::spawn(async move {
            let Ok(state) = tokio::task::spawn_blocking(move || check(&half)).await else {
                return;
            };
            if state == TransactionState::Unknown {
                return;
            }
            let cmd = end_command(
                &group,
                commit_log_offset,
                half_offset,
                &msg_id,
                &transaction_id,
                state,
                true,
            );
            if let Err(e) = session.links.oneway(&addr, cmd).await {
                debug!(%addr, error = %e, "answering a check-back failed");
            }
        });
    }
}
