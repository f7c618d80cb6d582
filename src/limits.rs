//! The process's descriptor limit. Every connection is a descriptor, and the
//! default soft limit (1,024 on most distributions) would refuse connections long
//! before memory or CPU run out, while the hard limit, which an unprivileged
//! process may raise its soft limit to, is usually far higher (issue #33).

use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};

/// Below this hard limit the start-up log says how to raise it (a broker's
/// connections, files and listeners all count against it).
const LOW_HARD_LIMIT: u64 = 65_536;

/// Raises the soft `RLIMIT_NOFILE` to the hard one; returns (before, after) soft
/// limits (`None`: unlimited). Logs the change, and how to raise the hard limit
/// when it is low.
pub fn raise_fd_limit() -> (Option<u64>, Option<u64>) {
    let lim = getrlimit(Resource::Nofile);
    let before = lim.current;
    if lim.current < lim.maximum || (lim.maximum.is_none() && lim.current.is_some()) {
        let raised = Rlimit {
            current: lim.maximum,
            maximum: lim.maximum,
        };
        if let Err(e) = setrlimit(Resource::Nofile, raised) {
            tracing::warn!(error = %e, "could not raise the open-file limit");
            return (before, before);
        }
    }
    let after = getrlimit(Resource::Nofile).current;
    if after != before {
        tracing::info!(
            from = before.map_or("unlimited".to_owned(), |v| v.to_string()),
            to = after.map_or("unlimited".to_owned(), |v| v.to_string()),
            "raised the open-file limit to the hard limit"
        );
    }
    if let Some(hard) = after
        && hard < LOW_HARD_LIMIT
    {
        tracing::info!(
            limit = hard,
            "at most ~{hard} connections: the open-file limit caps them; raise the hard \
             limit (ulimit -Hn, LimitNOFILE= in a systemd unit, docker run --ulimit \
             nofile=N:N; fs.nr_open above N) for more"
        );
    }
    (before, after)
}
