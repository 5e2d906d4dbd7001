//! The writers' turn on SQLite. The group-commit writers (submissions, nonces, heartbeat rows,
//! canary deliveries), the leader's placement commits and the other writes that hold SQLite's
//! write lock for a while take turns here rather than at that lock, where the loser's busy
//! handler sleeps 1–100 ms between tries: with three writers meeting there, a commit waited tens
//! of milliseconds for a lock long free while the CPUs idled (under `bench api`, 210 such sleeps
//! and 3.6 s asleep in 5 s; 25 and 0.6 s with turns). PostgreSQL locks rows, so there the writers
//! commit side by side (no turns).
//!
//! Turns are first come, first served, with one exception: the leader's placements go ahead of
//! the writers waiting (`Precedence::First`), though never twice in a row while another writer
//! waits, so the others wait at most one chunk of placements longer. In one line, each chunk of
//! placements waited behind every batch of submissions and heartbeat rows queued before it
//! (0.1–1 s a chunk in `bench api` at 125,000 nodes, several times the chunk's own commit):
//! under a load the coordinator cannot keep up with, submissions were acknowledged faster than
//! they were placed, and the queue of acknowledged jobs grew without bound. With placements
//! first, the wait moves to the acknowledgement, where the client sees it and slows down, and
//! a job acknowledged gets its lease within a pass or two (docs/decisions.md, "The placements'
//! turn").

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

/// Where a writer stands in the line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Precedence {
    /// First come, first served.
    InTurn,
    /// Ahead of those waiting, but not twice in a row while another writer waits.
    First,
}

/// The turns of one store's writers; cloned handles share them.
#[derive(Clone, Default)]
pub struct Turns(Arc<Mutex<Queue>>);

#[derive(Default)]
struct Queue {
    held: bool,
    /// The writer holding the turn, or the last to hold it, went first.
    last_first: bool,
    first: VecDeque<oneshot::Sender<Turn>>,
    in_turn: VecDeque<oneshot::Sender<Turn>>,
}

/// A writer's turn; the next writer's begins when it is dropped.
pub struct Turn {
    line: Arc<Mutex<Queue>>,
}

impl Drop for Turn {
    fn drop(&mut self) {
        hand_over(&self.line);
    }
}

impl Turns {
    /// Waits for this writer's turn. A writer that stops waiting (its future dropped) gives up
    /// its place; a turn handed to it then passes on.
    pub async fn take(&self, precedence: Precedence) -> Turn {
        let waiting = {
            let mut queue = self.0.lock().expect("writers' turns lock");
            if !queue.held {
                queue.held = true;
                queue.last_first = precedence == Precedence::First;
                return Turn { line: self.0.clone() };
            }
            let (sender, receiver) = oneshot::channel();
            match precedence {
                Precedence::First => queue.first.push_back(sender),
                Precedence::InTurn => queue.in_turn.push_back(sender),
            }
            receiver
        };
        // Senders are dropped unsent only with the line, which `self` keeps.
        waiting.await.expect("a waiting writer's turn is handed over")
    }
}

/// Passes the turn to the next writer, or frees it when none waits.
fn hand_over(line: &Arc<Mutex<Queue>>) {
    let next = {
        let mut queue = line.lock().expect("writers' turns lock");
        // A placement goes next, unless one just went and another writer waits.
        let others_wait = !queue.in_turn.is_empty();
        let first_next = !queue.first.is_empty() && (!queue.last_first || !others_wait);
        let next = if first_next {
            queue.first.pop_front().map(|sender| (sender, true))
        } else {
            queue.in_turn.pop_front().map(|sender| (sender, false))
        };
        let Some((next, first)) = next else {
            queue.held = false;
            return;
        };
        queue.last_first = first;
        next
    };
    // A writer that stopped waiting refuses the turn; dropping it hands it on again.
    let _ = next.send(Turn { line: line.clone() });
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Starts a writer that records its name once it has the turn, and holds it until the
    /// returned sender fires.
    fn writer(
        turns: &Turns,
        name: &'static str,
        precedence: Precedence,
        log: &Arc<Mutex<Vec<&'static str>>>,
    ) -> (oneshot::Sender<()>, tokio::task::JoinHandle<()>) {
        let (done, hold) = oneshot::channel::<()>();
        let (turns, log) = (turns.clone(), log.clone());
        let task = tokio::spawn(async move {
            let _turn = turns.take(precedence).await;
            log.lock().unwrap().push(name);
            let _ = hold.await;
        });
        (done, task)
    }

    async fn settle() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    #[tokio::test]
    async fn placements_go_ahead_of_waiting_writers_but_not_twice_in_a_row() {
        let turns = Turns::default();
        let log = Arc::new(Mutex::new(Vec::new()));
        let holder = turns.take(Precedence::InTurn).await;
        let (a_done, a) = writer(&turns, "a", Precedence::InTurn, &log);
        settle().await;
        let (b_done, b) = writer(&turns, "b", Precedence::InTurn, &log);
        settle().await;
        let (p1_done, p1) = writer(&turns, "p1", Precedence::First, &log);
        settle().await;
        drop(holder);
        settle().await;
        assert_eq!(*log.lock().unwrap(), ["p1"], "the placement jumps the line");
        let (p2_done, p2) = writer(&turns, "p2", Precedence::First, &log);
        settle().await;
        p1_done.send(()).unwrap();
        p1.await.unwrap();
        settle().await;
        assert_eq!(
            *log.lock().unwrap(),
            ["p1", "a"],
            "one waiting writer between two placements"
        );
        a_done.send(()).unwrap();
        a.await.unwrap();
        settle().await;
        assert_eq!(*log.lock().unwrap(), ["p1", "a", "p2"]);
        p2_done.send(()).unwrap();
        p2.await.unwrap();
        settle().await;
        b_done.send(()).unwrap();
        b.await.unwrap();
        assert_eq!(*log.lock().unwrap(), ["p1", "a", "p2", "b"]);
        // Free again: the next writer has it at once.
        drop(
            tokio::time::timeout(Duration::from_secs(1), turns.take(Precedence::InTurn))
                .await
                .unwrap(),
        );
    }

    #[tokio::test]
    async fn a_writer_that_stops_waiting_does_not_keep_the_turn() {
        let turns = Turns::default();
        let log = Arc::new(Mutex::new(Vec::new()));
        let holder = turns.take(Precedence::InTurn).await;
        let gone = {
            let turns = turns.clone();
            tokio::spawn(async move {
                let _turn = turns.take(Precedence::First).await;
                unreachable!("aborted before its turn");
            })
        };
        settle().await;
        let (c_done, c) = writer(&turns, "c", Precedence::InTurn, &log);
        settle().await;
        gone.abort();
        let _ = gone.await;
        drop(holder);
        settle().await;
        assert_eq!(*log.lock().unwrap(), ["c"], "the turn passed over the writer that left");
        c_done.send(()).unwrap();
        c.await.unwrap();
        drop(
            tokio::time::timeout(Duration::from_secs(1), turns.take(Precedence::First))
                .await
                .unwrap(),
        );
    }
}
