//! The broker a soak run measures: a `rocketgate standalone` this process starts on
//! free ports (stopped with SIGTERM when dropped), or a running node named by address.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use anyhow::Context;

pub(crate) enum Node {
    Started {
        child: Child,
        addrs: HashMap<String, SocketAddr>,
    },
    Target {
        mqtt: SocketAddr,
        http: SocketAddr,
        ws: SocketAddr,
        namesrv: SocketAddr,
        pid: u32,
    },
}

impl Node {
    /// Starts `rocketgate standalone` with its data under `out/data` (removed first) and
    /// its log in `out/node.log`.
    pub(crate) fn start(out: &Path) -> anyhow::Result<Node> {
        let data = out.join("data");
        let _ = std::fs::remove_dir_all(&data);
        let log = std::fs::File::create(out.join("node.log"))?;
        let exe = std::env::current_exe().context("locating the rocketgate binary")?;
        let mut child = Command::new(exe)
            .args(["standalone", "--data-dir"])
            .arg(&data)
            .args(["--namesrv", "0", "--native", "0", "--mqtt", "0"])
            .args(["--http", "0", "--ws", "0"])
            .env("ROCKETGATE_STORE__SEGMENT_SIZE", "64MiB")
            // Old segments go, so a long run's disk use stays bounded.
            .env("ROCKETGATE_STORE__RETENTION", "10m")
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .context("starting rocketgate standalone")?;
        let stdout = child.stdout.take().context("no stdout")?;
        let mut addrs = HashMap::new();
        let mut lines = BufReader::new(stdout).lines();
        for line in lines.by_ref() {
            let line = line?;
            if let Some((door, addr)) = line
                .strip_prefix("rocketgate: ")
                .and_then(|l| l.split_once(" listening on "))
            {
                addrs.insert(door.to_string(), addr.trim().parse()?);
            }
            if line.contains("ready") {
                break;
            }
        }
        // Keep reading, so the node never writes into a closed pipe.
        std::thread::spawn(move || lines.for_each(drop));
        let node = Node::Started { child, addrs };
        for door in ["mqtt", "http", "ws", "namesrv"] {
            node.try_addr(door).with_context(|| {
                format!(
                    "the node did not announce its {door} address (log: {})",
                    out.join("node.log").display()
                )
            })?;
        }
        Ok(node)
    }

    fn try_addr(&self, door: &str) -> Option<SocketAddr> {
        match self {
            Node::Started { addrs, .. } => addrs.get(door).copied(),
            Node::Target {
                mqtt,
                http,
                ws,
                namesrv,
                ..
            } => match door {
                "mqtt" => Some(*mqtt),
                "http" => Some(*http),
                "ws" => Some(*ws),
                "namesrv" => Some(*namesrv),
                _ => None,
            },
        }
    }

    /// A door's address (checked at start for the four the soak uses).
    pub(crate) fn addr(&self, door: &str) -> SocketAddr {
        self.try_addr(door)
            .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 0)))
    }

    pub(crate) fn pid(&self) -> u32 {
        match self {
            Node::Started { child, .. } => child.id(),
            Node::Target { pid, .. } => *pid,
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Node::Started { child, .. } = self {
            // SIGTERM: a clean shutdown, then wait for it.
            // SAFETY: kill(2) on our own child, which has not been reaped yet.
            unsafe {
                libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
            }
            let _ = child.wait();
        }
    }
}
