//! Group commit: requests hand their writes to one writer task, which takes everything queued
//! (up to a named maximum) and writes it in one database transaction, then answers each
//! request. One fsync covers many requests; under light load a batch is a single write.
//! On SQLite the writer runs on a thread of its own (see [`WriterHome`]).

use std::future::Future;

use tokio::sync::{mpsc, oneshot};

use crate::error::ApiError;

/// Writes waiting for the writer; a full queue refuses new work with a 503 instead of growing.
pub const BATCH_QUEUE_MAX: usize = 65_536;

type Reply<R> = oneshot::Sender<Result<R, String>>;

pub struct Batcher<T, R> {
    queue: mpsc::Sender<(T, Reply<R>)>,
    what: &'static str,
}

impl<T, R> Clone for Batcher<T, R> {
    fn clone(&self) -> Self {
        Batcher {
            queue: self.queue.clone(),
            what: self.what,
        }
    }
}

/// Where a writer runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriterHome {
    /// A task on the caller's runtime.
    Task,
    /// A thread of its own, still on the caller's runtime (its timers and sockets are that
    /// runtime's). A transaction awaits once per statement; as a task, each of those awaits
    /// waited in the shared run queue behind every request in flight. For SQLite, whose
    /// statements run on threads of their own: with this and the writers' turns (`state.rs`),
    /// `bench api` on 20,000 nodes went from 910–1,000 to 1,420–1,620 heartbeats/s, the turns
    /// alone giving 1,310–1,370. With PostgreSQL it measured slower (980–1,130 against
    /// 1,270–1,300 as a task): the writer's socket readiness waits for a busy worker to poll
    /// the I/O driver.
    Thread,
}

impl<T: Send + 'static, R: Send + 'static> Batcher<T, R> {
    /// Starts the writer. `flush` writes a batch and returns one result per item, in order.
    ///
    /// # Panics
    ///
    /// Outside a Tokio runtime, or if the operating system cannot start a thread.
    pub fn start<F, Fut>(what: &'static str, batch_max: usize, home: WriterHome, flush: F) -> Batcher<T, R>
    where
        F: Fn(Vec<T>) -> Fut + Send + 'static,
        Fut: Future<Output = Result<Vec<R>, String>> + Send,
    {
        let (queue, mut receiver) = mpsc::channel::<(T, Reply<R>)>(BATCH_QUEUE_MAX);
        let writer = async move {
            let mut items = Vec::with_capacity(batch_max);
            let mut replies = Vec::with_capacity(batch_max);
            while let Some((item, reply)) = receiver.recv().await {
                items.push(item);
                replies.push(reply);
                while items.len() < batch_max {
                    match receiver.try_recv() {
                        Ok((item, reply)) => {
                            items.push(item);
                            replies.push(reply);
                        }
                        Err(_) => break,
                    }
                }
                let count = items.len();
                match flush(std::mem::take(&mut items)).await {
                    Ok(results) if results.len() == count => {
                        for (reply, result) in replies.drain(..).zip(results) {
                            let _ = reply.send(Ok(result));
                        }
                    }
                    Ok(results) => {
                        let message = format!(
                            "{what}: the writer returned {} results for {count} items",
                            results.len()
                        );
                        tracing::error!("{message}");
                        for reply in replies.drain(..) {
                            let _ = reply.send(Err(message.clone()));
                        }
                    }
                    Err(message) => {
                        tracing::warn!(what, %message, count, "batch write failed");
                        for reply in replies.drain(..) {
                            let _ = reply.send(Err(message.clone()));
                        }
                    }
                }
            }
        };
        match home {
            WriterHome::Task => {
                tokio::spawn(writer);
            }
            WriterHome::Thread => {
                let runtime = tokio::runtime::Handle::current();
                // The thread ends when every `Batcher` clone is dropped and the queue closes.
                std::thread::Builder::new()
                    .name(format!("fallow-{what}-writer"))
                    .spawn(move || runtime.block_on(writer))
                    .expect("the operating system starts a writer thread");
            }
        }
        Batcher { queue, what }
    }

    /// Queues one write and waits until its batch is committed.
    pub async fn submit(&self, item: T) -> Result<R, ApiError> {
        let (reply, answer) = oneshot::channel();
        self.queue
            .try_send((item, reply))
            .map_err(|_| ApiError::Unavailable(format!("the {} writer is saturated; retry shortly", self.what)))?;
        match answer.await {
            Ok(Ok(result)) => Ok(result),
            Ok(Err(message)) => Err(ApiError::Unavailable(format!("{}: {message}; retry", self.what))),
            Err(_) => Err(ApiError::Unavailable(format!(
                "the {} writer stopped; retry",
                self.what
            ))),
        }
    }
}

type Job = std::pin::Pin<Box<dyn Future<Output = ()> + Send>>;

/// Runs writes that are not batched (a pass's placements) where the batchers run theirs
/// ([`WriterHome`]): on SQLite a thread of its own that runs one at a time, so that a
/// transaction's statement-by-statement awaits do not each wait behind every request in flight
/// (a pass's 64 placements, six statements each, took 0.7 s to commit so under `bench api`);
/// on PostgreSQL the caller's task.
#[derive(Clone)]
pub struct WriterThread {
    queue: Option<mpsc::UnboundedSender<Job>>,
}

impl WriterThread {
    /// # Panics
    ///
    /// With `WriterHome::Thread` outside a Tokio runtime, or if the operating system cannot
    /// start a thread.
    pub fn start(home: WriterHome) -> WriterThread {
        match home {
            WriterHome::Task => WriterThread { queue: None },
            WriterHome::Thread => {
                let (queue, mut receiver) = mpsc::unbounded_channel::<Job>();
                let runtime = tokio::runtime::Handle::current();
                // The thread ends when every clone is dropped and the queue closes.
                std::thread::Builder::new()
                    .name("fallow-writes".into())
                    .spawn(move || {
                        runtime.block_on(async move {
                            while let Some(job) = receiver.recv().await {
                                job.await;
                            }
                        });
                    })
                    .expect("the operating system starts a writer thread");
                WriterThread { queue: Some(queue) }
            }
        }
    }

    /// Runs `write` on the writer's thread (or here) and returns what it returned.
    pub async fn run<R: Send + 'static>(&self, write: impl Future<Output = R> + Send + 'static) -> Result<R, ApiError> {
        let Some(queue) = &self.queue else {
            return Ok(write.await);
        };
        let (reply, answer) = oneshot::channel();
        queue
            .send(Box::pin(async move {
                let _ = reply.send(write.await);
            }))
            .map_err(|_| ApiError::Unavailable("the writer thread stopped; retry".into()))?;
        answer
            .await
            .map_err(|_| ApiError::Unavailable("the writer thread stopped; retry".into()))
    }
}
