//! The epoch file: which master epoch wrote which part of the commit log (RocketMQ's
//! `epochFileCheckpoint`, Kafka's `leader-epoch-checkpoint`), and the rule that finds
//! where two logs of a broker group stop agreeing ([`divergence`]).
//!
//! In controller mode (docs/controller.md) every master is elected at an epoch higher
//! than any before. When it starts taking writes it records `(epoch, its log end)`: every
//! byte from that offset on, up to the next entry's start, was written by the master of
//! that epoch. A slave mirrors its master's entries as it copies the bytes they describe.
//! Two nodes whose entries give an offset the same epoch hold the same byte there (one
//! master wrote it, once); the first offset where their epochs differ is where their
//! logs may differ, and a slave cuts its log back to it before it follows
//! (docs/replication.md, "Epochs and truncation").
//!
//! The file, `<data_dir>/epochs`, is text:
//!
//! ```text
//! rocketgate-epochs 1
//! 1 0
//! 2 1048576
//! ```
//!
//! a header with the format version, then one `epoch start` line per entry: epochs
//! strictly increasing, starts non-decreasing, no epoch 0 (0 means "no controller":
//! bytes before the first entry were written outside controller mode). It is replaced
//! atomically like the checkpoint (a temporary file written and synced, renamed, the
//! directory synced): a crash leaves the old list or the new one, never a mix; a torn
//! `epochs.tmp` is ignored and overwritten by the next change. A file that does not
//! parse is an error naming the line, never read as empty: an empty list would make the
//! node look like one that never took part in an election.
//!
//! # Invariants
//! - Every entry is durable before any byte it describes is written or acknowledged:
//!   a master calls [`EpochFile::begin`] before it takes writes; a slave records the
//!   master's entries for a run ([`EpochFile::adopt`] up to the run's end) before it
//!   appends the run.
//! - After a log truncation to `to`, [`EpochFile::truncate_after`]`(to)` runs **after**
//!   the log's cut is durable (an entry beyond the end describes nothing and is harmless;
//!   bytes whose entry is gone would carry an older epoch's label, which is not).

use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::store::io::Files;
use crate::{Error, Result};

/// The file's name in the data directory.
pub const FILE_NAME: &str = "epochs";
const TMP_NAME: &str = "epochs.tmp";
const HEADER: &str = "rocketgate-epochs";
const FORMAT_VERSION: u32 = 1;

/// The master of `epoch` wrote the log from `start` up to the next entry's start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct EpochEntry {
    pub epoch: u64,
    pub start: u64,
}

impl From<(u64, u64)> for EpochEntry {
    fn from((epoch, start): (u64, u64)) -> Self {
        EpochEntry { epoch, start }
    }
}

impl From<EpochEntry> for (u64, u64) {
    fn from(e: EpochEntry) -> Self {
        (e.epoch, e.start)
    }
}

/// Checks the order rules of an entry list: `Err` says which entry breaks which rule.
pub fn check(entries: &[EpochEntry]) -> std::result::Result<(), String> {
    for (i, e) in entries.iter().enumerate() {
        if e.epoch == 0 {
            return Err(format!(
                "entry {i}: epoch 0 is not an elected master's epoch"
            ));
        }
        if let Some(prev) = i.checked_sub(1).map(|p| entries[p]) {
            if e.epoch <= prev.epoch {
                return Err(format!(
                    "entry {i}: epoch {} does not follow epoch {}",
                    e.epoch, prev.epoch
                ));
            }
            if e.start < prev.start {
                return Err(format!(
                    "entry {i}: epoch {} starts at {}, before epoch {}'s start {}",
                    e.epoch, e.start, prev.epoch, prev.start
                ));
            }
        }
    }
    Ok(())
}

/// The epoch file of one data directory. Not shared by itself: the broker keeps it
/// behind one lock (a change is a short file write, never across an `.await`).
#[derive(Debug)]
pub struct EpochFile {
    dir: PathBuf,
    entries: Vec<EpochEntry>,
    files: Files,
}

impl EpochFile {
    /// Reads `<dir>/epochs`; a missing file is an empty list, one that does not parse
    /// is [`Error::Corrupt`].
    pub fn open(dir: &Path) -> Result<EpochFile> {
        Self::open_with(dir, Files::os())
    }

    /// [`EpochFile::open`] through the given file operations.
    pub fn open_with(dir: &Path, files: Files) -> Result<EpochFile> {
        let path = dir.join(FILE_NAME);
        let entries = match fs::read(&path) {
            Ok(text) => parse(&path, &text)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(Error::io(&path, e)),
        };
        Ok(EpochFile {
            dir: dir.to_owned(),
            entries,
            files,
        })
    }

    /// The file's path.
    pub fn path(&self) -> PathBuf {
        self.dir.join(FILE_NAME)
    }

    /// Every entry, oldest first.
    pub fn entries(&self) -> Vec<EpochEntry> {
        self.entries.clone()
    }

    /// The entries as `(epoch, start)` pairs (the replication stream's form).
    pub fn pairs(&self) -> Vec<(u64, u64)> {
        self.entries.iter().map(|e| (e.epoch, e.start)).collect()
    }

    /// The newest entry.
    pub fn last(&self) -> Option<EpochEntry> {
        self.entries.last().copied()
    }

    /// This node, elected master at `epoch`, starts writing at its log end `start`.
    /// Entries starting beyond `start` are dropped first (they describe bytes this node
    /// does not hold). An epoch older than the last one left is refused; the same epoch
    /// again (a master restarting in the epoch it already began) changes nothing.
    /// Durable when it returns.
    pub fn begin(&mut self, epoch: u64, start: u64) -> Result<()> {
        let next = begun(&self.entries, epoch, start)?;
        self.replace(next)
    }

    /// A slave mirrors its master's entries: its list becomes `master`'s entries that
    /// start at or before `upto` (its log end, or the end of the run it is about to
    /// append; later ones are recorded when the bytes they describe arrive). Durable
    /// when it returns; no write when nothing changes. A `master` list that breaks the
    /// order rules is refused and changes nothing.
    pub fn adopt(&mut self, master: &[EpochEntry], upto: u64) -> Result<()> {
        check(master).map_err(|e| {
            Error::InvalidArgument(format!("the master's epoch list is malformed: {e}"))
        })?;
        self.replace(up_to(master, upto))
    }

    /// After the log was cut at `offset`: drops entries starting beyond it. Call it once
    /// the cut is durable (see the module's invariants); idempotent.
    pub fn truncate_after(&mut self, offset: u64) -> Result<()> {
        self.replace(up_to(&self.entries, offset))
    }

    fn replace(&mut self, next: Vec<EpochEntry>) -> Result<()> {
        if next == self.entries {
            return Ok(());
        }
        debug_assert!(check(&next).is_ok(), "{next:?}");
        let mut body = format!("{HEADER} {FORMAT_VERSION}\n");
        for e in &next {
            body.push_str(&format!("{} {}\n", e.epoch, e.start));
        }
        let path = self.path();
        self.files
            .replace_file(&path, &self.dir.join(TMP_NAME), body.as_bytes())
            .map_err(|e| Error::io(&path, e))?;
        self.entries = next;
        Ok(())
    }
}

/// What [`EpochFile::begin`] makes of `entries`.
fn begun(entries: &[EpochEntry], epoch: u64, start: u64) -> Result<Vec<EpochEntry>> {
    if epoch == 0 {
        return Err(Error::InvalidArgument(
            "epoch 0 is not an elected master's epoch".into(),
        ));
    }
    let mut next = up_to(entries, start);
    match next.last() {
        Some(last) if last.epoch == epoch => {}
        Some(last) if last.epoch > epoch => {
            return Err(Error::InvalidArgument(format!(
                "cannot begin epoch {epoch}: this node's epoch file already has epoch {}",
                last.epoch
            )));
        }
        _ => next.push(EpochEntry { epoch, start }),
    }
    Ok(next)
}

/// The entries starting at or before `offset`.
fn up_to(entries: &[EpochEntry], offset: u64) -> Vec<EpochEntry> {
    entries
        .iter()
        .copied()
        .filter(|e| e.start <= offset)
        .collect()
}

fn parse(path: &Path, text: &[u8]) -> Result<Vec<EpochEntry>> {
    let corrupt = |offset: usize, reason: String| Error::Corrupt {
        path: path.to_owned(),
        offset: offset as u64,
        reason,
    };
    let text = std::str::from_utf8(text)
        .map_err(|e| corrupt(e.valid_up_to(), "the epoch file is not UTF-8 text".into()))?;
    if !text.is_empty() && !text.ends_with('\n') {
        return Err(corrupt(
            text.len(),
            "the epoch file's last line is cut short".into(),
        ));
    }
    let mut at = 0;
    let mut entries = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let here = at;
        at += line.len() + 1;
        if n == 0 {
            let version = line
                .strip_prefix(HEADER)
                .and_then(|v| v.strip_prefix(' '))
                .and_then(|v| v.parse::<u32>().ok())
                .ok_or_else(|| {
                    corrupt(
                        here,
                        format!("the first line is `{line}`, not `{HEADER} <version>`"),
                    )
                })?;
            if version != FORMAT_VERSION {
                return Err(corrupt(
                    here,
                    format!("epoch file format {version} (this build reads {FORMAT_VERSION})"),
                ));
            }
            continue;
        }
        let mut fields = line.split(' ');
        let entry = match (fields.next(), fields.next(), fields.next()) {
            (Some(epoch), Some(start), None) => epoch
                .parse::<u64>()
                .ok()
                .zip(start.parse::<u64>().ok())
                .map(EpochEntry::from),
            _ => None,
        };
        let entry = entry.ok_or_else(|| {
            corrupt(
                here,
                format!("line {} is `{line}`, not `<epoch> <start>`", n + 1),
            )
        })?;
        entries.push(entry);
    }
    if text.is_empty() {
        return Err(corrupt(0, "the epoch file is empty (no header)".into()));
    }
    check(&entries).map_err(|e| corrupt(0, e))?;
    Ok(entries)
}

/// The offset up to which `slave`'s log (ending at `slave_end`) is known to hold the
/// same bytes as `master`'s (ending at `master_end`): the slave cuts its log there
/// when it is below its end, and the stream continues from it.
///
/// Each list labels every offset with the epoch of the last entry starting at or
/// before it (0 before the first entry: bytes written outside controller mode). One
/// master writes each offset of its epoch once, so where two lists give an offset the
/// same epoch the two logs hold the same byte. The answer is the first offset where
/// the labels differ, and never beyond either log's end. This is Kafka's
/// OffsetsForLeaderEpoch rule — the slave's largest epoch `e` the master knows, then
/// `min(end of e in the slave, end of e in the master, slave_end)` — made exact for
/// the case Kafka fixed in KIP-279: when the master never had the slave's epoch `e`,
/// the end of the master's own epoch before it is not enough, the slave's epoch `e`
/// starts where the logs part.
///
/// Edge cases, thought through:
/// - A slave with **no entries** has never been in an election (a node from before
///   controller mode, or a new one): the answer is `slave_end`, and the caller applies
///   the rules without epochs (a log beyond the master's end is refused).
/// - A master with no entries and a slave with some (a misconfiguration: masters begin
///   an epoch before they take writes): the slave's bytes from its first entry on were
///   written in an election the master never saw, so the answer is at most that start
///   (0 when the slave's first epoch starts at 0).
/// - A slave whose epochs are all newer than the master's (it knows a newer master:
///   the master refuses it as stale before asking this) gets the start of its first
///   entry, never more — this rule alone never lets newer bytes stand.
/// - The slave ahead of the master in the master's own last epoch (the unacknowledged
///   tail of an old master, or bytes a crashed master lost): `master_end`.
pub fn divergence(
    slave: &[EpochEntry],
    slave_end: u64,
    master: &[EpochEntry],
    master_end: u64,
) -> u64 {
    if slave.is_empty() {
        return slave_end;
    }
    let cap = slave_end.min(master_end);
    let label = |list: &[EpochEntry], at: u64| {
        list.iter()
            .rev()
            .find(|e| e.start <= at)
            .map_or(0, |e| e.epoch)
    };
    // The labels change only at entry starts: check 0 and each of them, in order.
    let mut points: Vec<u64> = std::iter::once(0)
        .chain(slave.iter().map(|e| e.start))
        .chain(master.iter().map(|e| e.start))
        .filter(|p| *p < cap)
        .collect();
    points.sort_unstable();
    points.dedup();
    points
        .into_iter()
        .find(|p| label(slave, *p) != label(master, *p))
        .unwrap_or(cap)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(pairs: &[(u64, u64)]) -> Vec<EpochEntry> {
        pairs.iter().copied().map(EpochEntry::from).collect()
    }

    #[test]
    fn same_history_agrees_up_to_the_shorter_end() {
        let h = list(&[(1, 0), (2, 100), (5, 400)]);
        assert_eq!(divergence(&h, 700, &h, 700), 700);
        // Slave behind: everything it holds is good.
        assert_eq!(divergence(&h, 250, &h, 700), 250);
        assert_eq!(divergence(&list(&[(1, 0), (2, 100)]), 250, &h, 700), 250);
        // Behind, with an entry adopted at exactly its end.
        assert_eq!(divergence(&list(&[(1, 0), (2, 100)]), 100, &h, 700), 100);
    }

    #[test]
    fn a_slave_ahead_in_the_masters_last_epoch_is_cut_at_the_masters_end() {
        let h = list(&[(1, 0), (2, 100)]);
        assert_eq!(divergence(&h, 900, &h, 600), 600);
    }

    #[test]
    fn an_old_master_is_cut_where_the_new_master_began() {
        // Epoch 1: A wrote to 500, B copied 400; B elected at 400 and wrote on.
        let old = list(&[(1, 0)]);
        let new = list(&[(1, 0), (2, 400)]);
        assert_eq!(divergence(&old, 500, &new, 800), 400);
        // The new master has written nothing yet: still 400.
        assert_eq!(divergence(&old, 500, &new, 400), 400);
        // The old master's tail was shorter than what the new one copied: nothing to cut.
        assert_eq!(divergence(&old, 350, &new, 800), 350);
    }

    #[test]
    fn a_tail_in_an_epoch_the_new_master_never_had() {
        // B master at epoch 2 from 100, wrote to 300 (C copied 250); C elected at 3.
        let b = list(&[(1, 0), (2, 100)]);
        let c = list(&[(1, 0), (2, 100), (3, 250)]);
        assert_eq!(divergence(&b, 300, &c, 900), 250);
        // C never saw epoch 2 at all (it had 90 bytes of epoch 1 when elected).
        let c = list(&[(1, 0), (3, 90)]);
        assert_eq!(divergence(&b, 300, &c, 900), 90);
        // Kafka's KIP-279 case: the slave's newest epoch (3) is unknown to the master,
        // whose epoch 2 runs further than the slave's: the logs part at the slave's 3.
        let slave = list(&[(1, 0), (2, 100), (3, 250)]);
        let master = list(&[(1, 0), (2, 100), (4, 300)]);
        assert_eq!(divergence(&slave, 400, &master, 900), 250);
        // And the slave lacks the master's epoch 2 altogether.
        let slave = list(&[(1, 0), (3, 250)]);
        assert_eq!(divergence(&slave, 400, &master, 900), 100);
    }

    #[test]
    fn several_elections() {
        let master = list(&[
            (1, 0),
            (2, 1000),
            (4, 1500),
            (7, 3000),
            (8, 3000),
            (9, 4200),
        ]);
        // A follower of epoch 7's master that got to 3500: epoch 7 left nothing in this
        // master's log (epoch 8 starts at the same offset), so 3000.. differs.
        let slave = list(&[(1, 0), (2, 1000), (4, 1500), (7, 3000)]);
        assert_eq!(divergence(&slave, 3500, &master, 5000), 3000);
        // Master of epoch 6 (never known to this master) from 2000.
        let slave = list(&[(1, 0), (2, 1000), (4, 1500), (6, 2000)]);
        assert_eq!(divergence(&slave, 2600, &master, 5000), 2000);
        // A follower fully caught up through epoch 9.
        assert_eq!(divergence(&master, 5000, &master, 5000), 5000);
        assert_eq!(divergence(&master[..5], 4100, &master, 5000), 4100);
    }

    #[test]
    fn empty_lists() {
        // A slave that never took part: its end (the old rules decide).
        assert_eq!(divergence(&[], 500, &list(&[(3, 0)]), 100), 500);
        assert_eq!(divergence(&[], 500, &[], 100), 500);
        // A master without entries: the slave's epochs are nothing it knows.
        assert_eq!(divergence(&list(&[(1, 0)]), 500, &[], 800), 0);
        assert_eq!(divergence(&list(&[(1, 200)]), 500, &[], 800), 200);
        // Epochs all newer than the master's: never beyond the slave's first start.
        assert_eq!(
            divergence(&list(&[(5, 0)]), 500, &list(&[(1, 0), (2, 10)]), 800),
            0
        );
        // Empty logs.
        assert_eq!(divergence(&list(&[(1, 0)]), 0, &list(&[(1, 0)]), 0), 0);
    }

    /// A broker group in memory: random writes, copies, crashes and unclean
    /// elections (any node), each node's list kept by the same rules the file uses.
    /// Every byte a master writes is unique, so the true divergence of two logs is
    /// the first offset where their bytes differ: [`divergence`] must find exactly it.
    #[test]
    fn divergence_matches_the_bytes_in_random_histories() {
        use rand::{Rng, SeedableRng};
        #[derive(Default)]
        struct Node {
            log: Vec<u64>,
            entries: Vec<EpochEntry>,
        }
        for seed in 0..60u64 {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let mut nodes = (0..3).map(|_| Node::default()).collect::<Vec<_>>();
            let (mut master, mut epoch, mut next_byte) = (0usize, 1u64, 0u64);
            nodes[0].entries = begun(&[], 1, 0).unwrap();
            let mut truncations = 0;
            for _ in 0..800 {
                match rng.random_range(0..10) {
                    0..=3 => {
                        for _ in 0..rng.random_range(1..20) {
                            nodes[master].log.push(next_byte);
                            next_byte += 1;
                        }
                    }
                    4..=8 => {
                        let s = rng.random_range(0..nodes.len());
                        if s == master {
                            continue;
                        }
                        let m = std::mem::take(&mut nodes[master]);
                        let slave = &mut nodes[s];
                        let (s_end, m_end) = (slave.log.len(), m.log.len());
                        let p = divergence(&slave.entries, s_end as u64, &m.entries, m_end as u64);
                        let cap = s_end.min(m_end);
                        let truth =
                            (0..cap).find(|&i| slave.log[i] != m.log[i]).unwrap_or(cap) as u64;
                        assert_eq!(p, truth, "seed {seed}");
                        if p < s_end as u64 {
                            // Cut the log durably, then the list.
                            slave.log.truncate(p as usize);
                            slave.entries = up_to(&slave.entries, p);
                            truncations += 1;
                        } else {
                            slave.entries = up_to(&m.entries, s_end as u64);
                            let run = rng.random_range(0..=(m_end - s_end).min(30));
                            // The run's entries first, then (unless it crashes) its bytes.
                            slave.entries = up_to(&m.entries, (s_end + run) as u64);
                            if rng.random_range(0..10) > 0 {
                                slave.log.extend_from_slice(&m.log[s_end..s_end + run]);
                            }
                        }
                        nodes[master] = m;
                    }
                    _ => {
                        // Any node, in sync or not (unclean elections included).
                        master = rng.random_range(0..nodes.len());
                        epoch += 1;
                        let end = nodes[master].log.len() as u64;
                        nodes[master].entries = begun(&nodes[master].entries, epoch, end).unwrap();
                    }
                }
            }
            assert!(truncations > 0, "seed {seed} never diverged");
        }
    }

    #[test]
    fn begin_appends_drops_what_is_not_held_and_refuses_the_past() {
        let dir = tempfile::tempdir().unwrap();
        let mut f = EpochFile::open(dir.path()).unwrap();
        assert_eq!(f.last(), None);
        f.begin(1, 0).unwrap();
        f.begin(3, 500).unwrap();
        assert_eq!(f.entries(), list(&[(1, 0), (3, 500)]));
        // Older epochs are refused; the same one again is a no-op.
        assert!(matches!(f.begin(2, 900), Err(Error::InvalidArgument(_))));
        assert!(matches!(f.begin(0, 900), Err(Error::InvalidArgument(_))));
        f.begin(3, 900).unwrap();
        assert_eq!(f.entries(), list(&[(1, 0), (3, 500)]));
        // Elected again with a log that ends at 400 (lost its tail): epoch 3's entry
        // described bytes it no longer holds.
        f.begin(5, 400).unwrap();
        assert_eq!(f.entries(), list(&[(1, 0), (5, 400)]));
        assert_eq!(
            f.last(),
            Some(EpochEntry {
                epoch: 5,
                start: 400
            })
        );
        assert_eq!(f.pairs(), vec![(1, 0), (5, 400)]);
    }

    #[test]
    fn adopt_mirrors_the_master_up_to_the_log_end_and_truncate_after_cuts() {
        let dir = tempfile::tempdir().unwrap();
        let mut f = EpochFile::open(dir.path()).unwrap();
        f.begin(1, 0).unwrap();
        f.begin(3, 500).unwrap();
        let master = list(&[(1, 0), (2, 300), (4, 800), (6, 2000)]);
        f.adopt(&master, 800).unwrap();
        assert_eq!(f.entries(), list(&[(1, 0), (2, 300), (4, 800)]));
        f.adopt(&master, 5000).unwrap();
        assert_eq!(f.entries(), master);
        // A malformed list from the wire changes nothing.
        assert!(f.adopt(&list(&[(2, 0), (1, 10)]), 100).is_err());
        assert!(f.adopt(&list(&[(1, 10), (2, 0)]), 100).is_err());
        assert_eq!(f.entries(), master);
        f.truncate_after(800).unwrap();
        assert_eq!(f.entries(), list(&[(1, 0), (2, 300), (4, 800)]));
        f.truncate_after(799).unwrap();
        assert_eq!(f.entries(), list(&[(1, 0), (2, 300)]));
        let again = EpochFile::open(dir.path()).unwrap();
        assert_eq!(again.entries(), list(&[(1, 0), (2, 300)]));
    }

    #[test]
    fn the_file_survives_a_reopen_and_a_torn_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        {
            let mut f = EpochFile::open(dir.path()).unwrap();
            f.begin(1, 0).unwrap();
            f.begin(2, 4096).unwrap();
        }
        // A crash while writing the next version: the temporary file is torn.
        fs::write(dir.path().join(TMP_NAME), b"rocketgate-epochs 1\n1 0\n2 40").unwrap();
        let mut f = EpochFile::open(dir.path()).unwrap();
        assert_eq!(f.entries(), list(&[(1, 0), (2, 4096)]));
        f.begin(3, 8192).unwrap();
        let f = EpochFile::open(dir.path()).unwrap();
        assert_eq!(f.entries(), list(&[(1, 0), (2, 4096), (3, 8192)]));
        assert_eq!(
            fs::read_to_string(dir.path().join(FILE_NAME)).unwrap(),
            "rocketgate-epochs 1\n1 0\n2 4096\n3 8192\n"
        );
    }

    #[test]
    fn the_checked_in_fixture_parses() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/epochs-v1");
        let text = fs::read(&path).unwrap();
        assert_eq!(
            parse(&path, &text).unwrap(),
            list(&[(1, 0), (2, 1048576), (5, 1048576), (7, 3145800)])
        );
    }

    #[test]
    fn a_corrupt_file_is_a_clear_error_never_an_empty_list() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE_NAME);
        for (body, says) in [
            (&b""[..], "empty"),
            (b"1 0\n", "not `rocketgate-epochs"),
            (b"rocketgate-epochs 2\n", "format 2"),
            (b"rocketgate-epochs 1\n1 0\n2 x\n", "line 3"),
            (b"rocketgate-epochs 1\n1 0 7\n", "line 2"),
            (b"rocketgate-epochs 1\n1 0\n2 10", "cut short"),
            (b"rocketgate-epochs 1\n2 0\n2 10\n", "does not follow"),
            (b"rocketgate-epochs 1\n1 50\n2 10\n", "before epoch 1"),
            (b"rocketgate-epochs 1\n0 0\n", "epoch 0"),
            (b"rocketgate-epochs 1\n\xff\n", "UTF-8"),
        ] {
            fs::write(&path, body).unwrap();
            match EpochFile::open(dir.path()) {
                Err(e @ Error::Corrupt { .. }) => {
                    assert!(e.to_string().contains(says), "{e} (wanted `{says}`)")
                }
                other => panic!("{body:?}: {other:?}"),
            }
        }
        // A well-formed empty list (header only) is empty, not an error.
        fs::write(&path, b"rocketgate-epochs 1\n").unwrap();
        assert_eq!(EpochFile::open(dir.path()).unwrap().entries(), vec![]);
    }
}
