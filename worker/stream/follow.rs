//! A reader's side of streamed replies, for a process that follows many turns at once
//! (`kvmem serve`): one LISTEN connection for all of them, subscribed to each followed
//! turn's channel while someone follows it, instead of a connection per request.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use sqlx::postgres::PgListener;
use sqlx::PgPool;
use tokio::sync::{mpsc, oneshot};
use tracing::warn;

use super::delta::Note;

/// What a follower hears about its turn.
#[derive(Debug, Clone, PartialEq)]
pub enum Heard {
    Note(Note),
    /// The LISTEN connection was lost and made again: notifications in between are gone,
    /// so the follower reads what it missed with [`super::so_far`].
    Lost,
}

enum Cmd {
    Follow {
        turn_id: i64,
        id: u64,
        tx: mpsc::UnboundedSender<Heard>,
        listening: oneshot::Sender<Result<(), FollowError>>,
    },
    Unfollow {
        turn_id: i64,
        id: u64,
    },
}

/// The shared LISTEN connection; cheap to clone. Its task starts with the first follower
/// and ends when the last clone is gone.
#[derive(Clone)]
pub struct Hub {
    pool: PgPool,
    cmds: Arc<OnceLock<mpsc::UnboundedSender<Cmd>>>,
    ids: Arc<AtomicU64>,
}

/// One follower of one turn. Dropping it unsubscribes.
pub struct Follow {
    pub rx: mpsc::UnboundedReceiver<Heard>,
    turn_id: i64,
    id: u64,
    cmds: mpsc::UnboundedSender<Cmd>,
}

impl Drop for Follow {
    fn drop(&mut self) {
        let _ = self.cmds.send(Cmd::Unfollow {
            turn_id: self.turn_id,
            id: self.id,
        });
    }
}

impl Hub {
    pub fn new(pool: PgPool) -> Hub {
        Hub {
            pool,
            cmds: Arc::new(OnceLock::new()),
            ids: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Follows a turn's channel. Returns once the LISTEN is in place, so that everything
    /// published after this returns is heard: read what came before with
    /// [`super::so_far`] after this call, not before.
    pub async fn follow(&self, turn_id: i64) -> Result<Follow, FollowError> {
        let cmds = self
            .cmds
            .get_or_init(|| {
                let (tx, rx) = mpsc::unbounded_channel();
                tokio::spawn(run(self.pool.clone(), rx));
                tx
            })
            .clone();
        let (tx, rx) = mpsc::unbounded_channel();
        let (listening, ready) = oneshot::channel();
        let id = self.ids.fetch_add(1, Ordering::Relaxed);
        cmds.send(Cmd::Follow {
            turn_id,
            id,
            tx,
            listening,
        })
        .map_err(|_| FollowError::Stopped)?;
        let follow = Follow {
            rx,
            turn_id,
            id,
            cmds,
        };
        ready.await.map_err(|_| FollowError::Stopped)??;
        Ok(follow)
    }
}

/// Why a turn's stream cannot be followed.
#[derive(Debug, thiserror::Error)]
pub enum FollowError {
    #[error("the stream listener has stopped")]
    Stopped,
    /// The listener's connection failed to LISTEN. Shared, because the same failure also
    /// makes the hub's task reconnect.
    #[error(transparent)]
    Listen(Arc<sqlx::Error>),
}

type Followers = HashMap<i64, Vec<(u64, mpsc::UnboundedSender<Heard>)>>;

/// The hub's task: one listener, its channels, and who hears each.
async fn run(pool: PgPool, mut cmds: mpsc::UnboundedReceiver<Cmd>) {
    let mut followers: Followers = HashMap::new();
    let mut listener = None;
    loop {
        let Some(l) = listener.as_mut() else {
            match connect(&pool, &followers).await {
                Ok(l) => {
                    listener = Some(l);
                    // Whatever was published while no connection listened.
                    lost(&followers);
                }
                Err(e) => {
                    warn!(error = %e, "stream listener cannot connect; retrying");
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
            }
            continue;
        };
        tokio::select! {
            cmd = cmds.recv() => match cmd {
                None => return,
                Some(cmd) => {
                    if let Err(e) = command(l, &mut followers, cmd).await {
                        warn!(error = %e, "stream listener failed; reconnecting");
                        listener = None;
                    }
                }
            },
            heard = l.try_recv() => match heard {
                Ok(Some(n)) => dispatch(&mut followers, n.payload()),
                // Reconnected (sqlx listens on every channel again): what came in between
                // is lost.
                Ok(None) => lost(&followers),
                Err(e) => {
                    warn!(error = %e, "stream listener failed; reconnecting");
                    listener = None;
                }
            },
        }
    }
}

/// A new listening connection, on the channels of every turn followed now.
async fn connect(pool: &PgPool, followers: &Followers) -> Result<PgListener, sqlx::Error> {
    let mut l = PgListener::connect_with(pool).await?;
    let channels: Vec<String> = followers.keys().map(|&t| channel(t)).collect();
    l.listen_all(channels.iter().map(String::as_str)).await?;
    Ok(l)
}

async fn command(
    listener: &mut PgListener,
    followers: &mut Followers,
    cmd: Cmd,
) -> Result<(), Arc<sqlx::Error>> {
    match cmd {
        Cmd::Follow {
            turn_id,
            id,
            tx,
            listening,
        } => {
            if !followers.contains_key(&turn_id) {
                let channel = channel(turn_id);
                if let Err(e) = listener.listen(&channel).await {
                    let e = Arc::new(e);
                    let _ = listening.send(Err(FollowError::Listen(Arc::clone(&e))));
                    return Err(e);
                }
            }
            followers.entry(turn_id).or_default().push((id, tx));
            let _ = listening.send(Ok(()));
        }
        Cmd::Unfollow { turn_id, id } => {
            let Some(list) = followers.get_mut(&turn_id) else {
                return Ok(());
            };
            list.retain(|(i, _)| *i != id);
            if list.is_empty() {
                followers.remove(&turn_id);
                listener
                    .unlisten(&channel(turn_id))
                    .await
                    .map_err(Arc::new)?;
            }
        }
    }
    Ok(())
}

fn dispatch(followers: &mut Followers, payload: &str) {
    let Some(note) = Note::parse(payload) else {
        return;
    };
    if let Some(list) = followers.get_mut(&note.turn_id()) {
        list.retain(|(_, tx)| tx.send(Heard::Note(note.clone())).is_ok());
    }
}

fn lost(followers: &Followers) {
    for (_, tx) in followers.values().flatten() {
        let _ = tx.send(Heard::Lost);
    }
}

/// `kvmem_turn_channel` (sql/api/stream.sql): the hub runs on every subscription, so it
/// does not ask the database for a name it is told to keep in step with; a test compares
/// the two.
pub fn channel(turn_id: i64) -> String {
    format!("kvmem_stream_{turn_id}")
}
