//! Batching: decisions waiting for a script call go together in the next
//! one, on a few connections in turn, with a bounded queue and a bounded
//! number of calls in flight.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use redis::aio::ConnectionManager;
use tokio::sync::{mpsc, oneshot, Semaphore};

use crate::backend::Deadline;
use crate::decision::Decision;
use crate::error::Error;
use crate::quota::Quota;

use super::script::{invoke, Functions, ScriptCall, SCRIPT};
use super::wire::{decode_reply, grouped, invocation, push_groups, Request};

/// The most decisions one script call carries. A cap well under the number
/// of decisions usually waiting splits a burst of arrivals over two or more
/// calls, so Redis starts on the first while the client still sends the
/// next: measured on 100,000 keys with 64 decisions in flight, 32 kept Redis
/// busier and decided more per second than 128, with the same ~20 decisions
/// per call on average.
pub(super) const MAX_BATCH: usize = 32;

/// Connections the batches take turns on. Redis reads every call waiting on
/// one connection in one pass and sends their replies together at its end,
/// so with one connection the replies come back in waves and Redis idles
/// while the client turns a wave around; two connections let it answer one
/// while the other's next call is on its way (measured: Redis ~97% busy
/// instead of ~94%).
pub(super) const BATCH_CONNECTIONS: usize = 2;

/// Script calls in flight at once from one limiter; decisions arriving while
/// all are busy queue for the next batch. Until Redis has answered a call,
/// and again after a call fails, a call goes alone: a frozen Redis is sent
/// one batch per failure rather than this many, and holds less to apply
/// when it thaws.
pub(crate) const MAX_IN_FLIGHT: usize = 16;

/// The most decisions waiting for a script call. A decision arriving while
/// this many wait (Redis is slower than the calls arrive) fails at once with
/// [`Error::Overloaded`], which the failure policy answers: the queue, and
/// the work Redis is left with, stay bounded however long Redis is slow.
pub(crate) const MAX_QUEUED: usize = 4_096;

/// A Redis limiter decides on a Tokio runtime, which runs its connection and
/// batching tasks: said when it has none, or when that runtime has shut down
/// (the batching task is gone).
pub(super) const NO_RUNTIME: Error = Error::NoRuntime {
    what: "a Redis limiter (its connection and batching)",
};

/// One queued decision.
pub(crate) struct Job {
    /// The full key name.
    pub key: String,
    pub quota: Quota,
    pub request: Request,
    pub reply: oneshot::Sender<Result<Decision, Error>>,
}

/// One queued all-or-nothing check: its keys' full names, quotas and
/// requests, in order.
pub(crate) struct Check {
    pub(super) keys: Vec<String>,
    pub(super) quotas: Vec<Quota>,
    pub(super) requests: Vec<Request>,
    pub(super) reply: oneshot::Sender<Result<Vec<Decision>, Error>>,
}

/// What one Redis's batches carry: single decisions, and all-or-nothing
/// checks, which share script calls with them (a check goes as a run of its
/// own, see `runs_invocation`).
pub(crate) enum Work {
    One(Job),
    All(Check),
}

/// Queued work whose caller may have gone.
pub(crate) trait Waiting {
    /// Whether its caller still waits for the answer.
    fn wanted(&self) -> bool;
}

impl Waiting for Job {
    fn wanted(&self) -> bool {
        Job::wanted(self)
    }
}

impl Waiting for Work {
    fn wanted(&self) -> bool {
        match self {
            Work::One(job) => job.wanted(),
            Work::All(check) => !check.reply.is_closed(),
        }
    }
}

impl Work {
    /// Each key's quota, request and full name, in the order of the reply.
    fn keys(&self) -> impl Iterator<Item = (&Quota, &Request, &str)> {
        let (one, all) = match self {
            Work::One(job) => (Some((&job.quota, &job.request, job.key.as_str())), None),
            Work::All(check) => (None, Some(check)),
        };
        let all = all.into_iter().flat_map(|check| {
            check
                .quotas
                .iter()
                .zip(&check.requests)
                .zip(&check.keys)
                .map(|((quota, request), key)| (quota, request, key.as_str()))
        });
        one.into_iter().chain(all)
    }
}

/// Waits for the batcher's answer, until `deadline`. Dropping `answer` (the
/// deadline passed, or the caller's future dropped) tells the batcher not
/// to send the work if it has not yet.
pub(crate) async fn await_answer<T>(
    deadline: &Deadline,
    answer: oneshot::Receiver<Result<T, Error>>,
) -> Result<T, Error> {
    // An error: the batching task is gone without an answer (its runtime
    // shut down).
    deadline
        .bound(async { answer.await.unwrap_or(Err(NO_RUNTIME)) })
        .await
}

/// Takes decisions off the queue and sends them in batches, with at most
/// `max_in_flight` script calls outstanding (one while Redis is not known
/// to answer), taking turns on `connections`; `send` sends one batch and
/// says whether Redis answered. Ends when the backend is dropped (the queue
/// closes) or its runtime shuts down.
pub(crate) async fn run_batches<T, C, S, F>(
    mut queue: mpsc::Receiver<T>,
    connections: Vec<C>,
    stale_on_failure: Option<Arc<AtomicBool>>,
    max_in_flight: usize,
    send: S,
) where
    T: Waiting,
    C: Clone + Send + 'static,
    S: Fn(C, Vec<T>) -> F,
    F: std::future::Future<Output = bool> + Send + 'static,
{
    let slots = Arc::new(Semaphore::new(max_in_flight));
    let answering = Arc::new(AtomicBool::new(false));
    for connection in connections.iter().cycle() {
        // Wait for a free slot first: meanwhile, arriving decisions queue up
        // and go together. A call that must go alone takes every slot.
        let wanted = if answering.load(Ordering::Acquire) {
            1
        } else {
            max_in_flight as u32
        };
        let Ok(slot) = slots.clone().acquire_many_owned(wanted).await else {
            return;
        };
        let Some(first) = queue.recv().await else {
            return;
        };
        // Let the callers that are ready run first, so their decisions join
        // this batch.
        tokio::task::yield_now().await;
        // A decision whose caller has gone (timed out, or its future was
        // dropped) is not sent: it would consume tokens nobody was answered
        // with.
        let mut jobs: Vec<T> = Some(first).into_iter().filter(T::wanted).collect();
        while jobs.len() < MAX_BATCH {
            match queue.try_recv() {
                Ok(job) if job.wanted() => jobs.push(job),
                Ok(_) => {}
                Err(_) => break,
            }
        }
        if jobs.is_empty() {
            continue;
        }
        let batch = send(connection.clone(), jobs);
        let answering = answering.clone();
        let stale = stale_on_failure.clone();
        tokio::spawn(async move {
            let answered = batch.await;
            answering.store(answered, Ordering::Release);
            if let (false, Some(stale)) = (answered, stale) {
                stale.store(true, Ordering::Release);
            }
            drop(slot);
        });
    }
}

impl Job {
    pub(crate) fn wanted(&self) -> bool {
        !self.reply.is_closed()
    }
}

/// Sends one batch and hands each caller its answer; whether Redis answered.
/// A `READONLY` refusal sets `demoted`.
pub(super) async fn send_batch(
    mut connection: ConnectionManager,
    functions: Arc<Functions>,
    demoted: Arc<AtomicBool>,
    batch: Vec<Work>,
) -> bool {
    let invocation = runs_invocation(&batch);
    let reply = invoke(&invocation, &mut connection, &functions).await;
    if reply.as_ref().is_err_and(super::is_read_only) {
        // A replica now: the lane's connections are made anew (see
        // `Lane::demoted`).
        demoted.store(true, Ordering::Release);
    }
    match reply {
        // While Redis takes no writes (over `maxmemory`, too few replicas,
        // a failed save), it refuses a call before its first write, so
        // this one wrote nothing, and a denial needs no write: each
        // decision goes again in a call of its own, so that denials are
        // answered and only the decisions that must write fail, rather than
        // every denial of the batch failing with the admission beside it
        // (and a failure policy that admits then admitting it).
        Err(error) if crate::error::refuses_writes(&error) && batch.len() > 1 => {
            let alone: Vec<_> = batch
                .into_iter()
                .filter(Waiting::wanted)
                .map(|work| {
                    let (mut connection, functions) = (connection.clone(), functions.clone());
                    tokio::spawn(async move {
                        let invocation = runs_invocation(std::slice::from_ref(&work));
                        let reply = invoke(&invocation, &mut connection, &functions).await;
                        answer(vec![work], reply)
                    })
                })
                .collect();
            let mut answered = false;
            for call in alone {
                answered |= call.await.unwrap_or(false);
            }
            answered
        }
        reply => answer(batch, reply),
    }
}

/// Hands each caller of `batch` its answer in `reply`; whether Redis
/// answered.
fn answer(batch: Vec<Work>, reply: redis::RedisResult<Vec<i64>>) -> bool {
    let answered = reply.is_ok();
    let decoded = reply
        .map_err(Error::from)
        .and_then(|reply| decode_reply(&reply, batch.iter().flat_map(Work::keys)));
    // A failed call, or a reply of the wrong length: every decision fails.
    let mut results = match decoded {
        Ok(results) => results.into_iter(),
        Err(error) => {
            fail_all(batch, &error);
            return answered;
        }
    };
    // `decode_reply` answered for every key, in order. The caller may have
    // timed out and gone: nothing to do then.
    for work in batch {
        match work {
            Work::One(job) => {
                if let Some(result) = results.next() {
                    let _ = job.reply.send(result);
                }
            }
            Work::All(check) => {
                // Taken whole before the first error is looked for, so that
                // the next caller's answers start where this check's end.
                let answers: Vec<_> = results.by_ref().take(check.keys.len()).collect();
                let _ = check.reply.send(answers.into_iter().collect());
            }
        }
    }
    answered
}

/// Hands `error` to every caller of `batch`.
pub(super) fn fail_all(batch: Vec<Work>, error: &Error) {
    for work in batch {
        match work {
            Work::One(job) => drop(job.reply.send(Err(error.clone()))),
            Work::All(check) => drop(check.reply.send(Err(error.clone()))),
        }
    }
}

/// One script call for `batch`: 'each' when it holds single decisions
/// only; otherwise 'runs', consecutive single decisions making one run
/// decided as 'each', and each check a run of its own decided as 'all'.
pub(super) fn runs_invocation(batch: &[Work]) -> ScriptCall {
    if batch.iter().all(|work| matches!(work, Work::One(_))) {
        let jobs = batch.iter().filter_map(|work| match work {
            Work::One(job) => Some((&job.key, job.request)),
            Work::All(_) => None,
        });
        return invocation("each", jobs);
    }
    let mut runs: Vec<(bool, Vec<(&String, Request)>)> = Vec::new();
    for work in batch {
        match (work, runs.last_mut()) {
            (Work::One(job), Some((false, run))) => run.push((&job.key, job.request)),
            (Work::One(job), _) => runs.push((false, vec![(&job.key, job.request)])),
            (Work::All(check), _) => runs.push((
                true,
                check
                    .keys
                    .iter()
                    .zip(check.requests.iter().copied())
                    .collect(),
            )),
        }
    }
    let mut invocation = ScriptCall::new(&SCRIPT);
    invocation.arg("runs").arg(runs.len());
    for (all, run) in &runs {
        let keys = run.len() as i64;
        invocation.arg(if *all { -keys } else { keys });
    }
    // Grouped run by run: a group never spans two runs.
    let mut groups = Vec::new();
    for (_, run) in runs {
        let (keys, run_groups) = grouped(run);
        for key in keys {
            invocation.key(key);
        }
        groups.extend(run_groups);
    }
    push_groups(&groups, &mut invocation);
    invocation
}
