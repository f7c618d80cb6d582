//! Password verifications (argon2id, 19 MiB and ~50 ms of CPU each) on threads of
//! their own at idle priority, fewer than the cores.
//!
//! Why not tokio's blocking pool: it runs as many verifications at once as
//! there are connects (up to 512 threads), each at the priority of the runtime's
//! workers, so a storm of logins with new credentials took the cores from the
//! connections already in (their QoS 1 p99 went to 5–8× on 2 cores,
//! docs/benchmarks.md, "Connect storms"). Here at most `threads` run at once
//! (cores − 1, at least 1), at `SCHED_IDLE`: they use CPU the broker leaves idle
//! and yield it at once when a runtime worker wakes. A login waits in the queue
//! meanwhile; under a broker that keeps every core busy it gets the small share
//! the kernel gives idle threads (slower logins, never a stalled broker).
//! `auth.verify_share` below 1 makes each thread rest after a verification, so it
//! uses at most that share of a core (fewer verifications/s, more idle CPU).

use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, oneshot};

/// A verification to run: the PHC string (`None`: the dummy hash, for an unknown
/// user), the presented password and where the answer goes.
struct Job {
    phc: Option<String>,
    password: Vec<u8>,
    answer: oneshot::Sender<bool>,
}

/// Verifications waiting beyond this many make the caller wait to enqueue.
const QUEUE: usize = 1024;

/// The verifying threads' queue; the threads end when it is dropped.
pub(crate) struct Verifier {
    jobs: mpsc::Sender<Job>,
}

impl Verifier {
    /// Starts `threads` verifying threads (named `rg-verify`), each using at most
    /// `share` of a core: after a verification that took `d` it rests
    /// `d × (1/share − 1)`.
    pub(crate) fn start(threads: usize, share: f64) -> Verifier {
        let rest_per_busy = if share > 0.0 && share < 1.0 {
            1.0 / share - 1.0
        } else {
            0.0
        };
        let (tx, rx) = mpsc::channel::<Job>(QUEUE);
        // One receiver shared by the threads: whichever is free takes the next job.
        // A std lock held while waiting for a job, never across an `.await`.
        let rx = Arc::new(Mutex::new(rx));
        for _ in 0..threads.max(1) {
            let rx = rx.clone();
            let spawned = std::thread::Builder::new()
                .name("rg-verify".into())
                .spawn(move || {
                    set_idle_priority();
                    loop {
                        let job = {
                            let mut rx = rocketgate_base::sync::lock(&rx);
                            rx.blocking_recv()
                        };
                        let Some(job) = job else { return };
                        let started = std::time::Instant::now();
                        let ok = match &job.phc {
                            Some(phc) => crate::store::verify_password(phc, &job.password),
                            None => crate::store::verify_password(dummy_hash(), &job.password),
                        };
                        let _ = job.answer.send(ok);
                        if rest_per_busy > 0.0 {
                            std::thread::sleep(started.elapsed().mul_f64(rest_per_busy));
                        }
                    }
                });
            if let Err(e) = spawned {
                tracing::error!(error = %e, "cannot start a password verification thread");
            }
        }
        Verifier { jobs: tx }
    }

    /// The default thread count: one fewer than the cores, at least one.
    pub(crate) fn default_threads() -> usize {
        std::thread::available_parallelism()
            .map(|n| n.get().saturating_sub(1))
            .unwrap_or(1)
            .max(1)
    }

    /// Verifies `password` against `phc` (`None`: the dummy hash); false when no
    /// thread is left to do it.
    pub(crate) async fn verify(&self, phc: Option<String>, password: Vec<u8>) -> bool {
        let (answer, rx) = oneshot::channel();
        let job = Job {
            phc,
            password,
            answer,
        };
        if self.jobs.send(job).await.is_err() {
            return false;
        }
        rx.await.unwrap_or(false)
    }
}

/// A PHC hash of a random password: verifying an unknown user's password against it
/// costs what a known user's does, so timing does not tell which users exist.
/// Computed on a verifying thread the first time it is needed.
fn dummy_hash() -> &'static str {
    static DUMMY_HASH: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    DUMMY_HASH.get_or_init(|| crate::store::hash_password(&rand::random::<[u8; 16]>()))
}

/// Lowers the calling thread to `SCHED_IDLE` (Linux; unprivileged). Best effort: on
/// failure or elsewhere the thread keeps its normal priority.
#[allow(unsafe_code)]
fn set_idle_priority() {
    #[cfg(target_os = "linux")]
    {
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: plain system call on the calling thread (pid 0) with a valid param.
        let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) };
        if rc != 0 {
            tracing::debug!(error = %std::io::Error::last_os_error(), "SCHED_IDLE refused");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn verifies_on_its_threads_and_answers_each_caller() {
        let v = Arc::new(Verifier::start(1, 0.5));
        let phc = crate::store::hash_password(b"right");
        let calls = ["right", "wrong", "right"].map(|pw| {
            let (v, phc) = (v.clone(), phc.clone());
            tokio::spawn(async move { v.verify(Some(phc), pw.as_bytes().to_vec()).await })
        });
        let mut got = Vec::new();
        for c in calls {
            got.push(c.await.unwrap());
        }
        assert_eq!(got, [true, false, true]);
        assert!(!v.verify(None, b"anything".to_vec()).await);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn its_threads_run_at_idle_priority() {
        let _v = Verifier::start(1, 1.0);
        // The thread sets its policy first thing; give it a moment.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            let idle = std::fs::read_dir("/proc/self/task")
                .unwrap()
                .flatten()
                .any(|t| {
                    let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
                    // Field 41 is the policy; SCHED_IDLE = 5.
                    let Some(close) = stat.rfind(')') else {
                        return false;
                    };
                    let rest: Vec<&str> = stat[close + 1..].split_whitespace().collect();
                    stat.contains("(rg-verify)") && rest.get(38) == Some(&"5")
                });
            if idle {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no rg-verify thread at SCHED_IDLE"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}
