//! Tables for people (`--json` prints the server's JSON instead), and the
//! progress bar of long operations.

use std::io::{IsTerminal, Write};

use serde_json::Value;

/// Left-aligned columns, two spaces apart.
pub fn print(headers: &[&str], rows: Vec<Vec<String>>) {
    let mut width: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for r in &rows {
        for (i, c) in r.iter().enumerate() {
            if i < width.len() {
                width[i] = width[i].max(c.chars().count());
            }
        }
    }
    let line = |cells: Vec<&str>| {
        let mut s = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                s.push_str(c);
            } else {
                s.push_str(&format!("{c:<w$}  ", w = width[i]));
            }
        }
        println!("{}", s.trim_end());
    };
    line(headers.to_vec());
    for r in &rows {
        line(r.iter().map(String::as_str).collect());
    }
    if rows.is_empty() {
        println!("(none)");
    }
}

/// `key: value` lines for one object.
pub fn pairs(rows: Vec<(&str, String)>) {
    let w = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    for (k, v) in rows {
        println!("{k:<w$}  {v}");
    }
}

/// A JSON value as a cell: strings bare, `null` as `-`.
pub fn cell(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => s.clone(),
        Value::Array(a) => a.iter().map(cell).collect::<Vec<_>>().join(","),
        other => other.to_string(),
    }
}

/// Unix ms as UTC `YYYY-MM-DD HH:MM:SS.mmm` (`-` for none).
pub fn time(v: &Value) -> String {
    let Some(ms) = v.as_i64() else {
        return "-".into();
    };
    humantime::format_rfc3339_millis(
        std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms.max(0) as u64),
    )
    .to_string()
    .replace('T', " ")
    .trim_end_matches('Z')
    .to_owned()
}

/// A `\r` progress bar on stderr, drawn only when stderr is a terminal.
pub struct Progress {
    total: u64,
    done: u64,
    tty: bool,
    label: &'static str,
}

impl Progress {
    pub fn new(label: &'static str, total: u64) -> Progress {
        let p = Progress {
            total,
            done: 0,
            tty: std::io::stderr().is_terminal(),
            label,
        };
        p.draw();
        p
    }

    pub fn step(&mut self) {
        self.done += 1;
        // Redraw at most ~200 times over the whole run.
        if self.done == self.total || self.done.is_multiple_of((self.total / 200).max(1)) {
            self.draw();
        }
    }

    fn draw(&self) {
        if !self.tty {
            return;
        }
        const W: u64 = 30;
        let filled = (self.done * W).checked_div(self.total).unwrap_or(W);
        let bar: String = (0..W).map(|i| if i < filled { '#' } else { '.' }).collect();
        let mut err = std::io::stderr();
        let _ = write!(err, "\r{} [{bar}] {}/{}", self.label, self.done, self.total);
        let _ = err.flush();
    }

    pub fn finish(self) {
        if self.tty {
            eprintln!();
        }
    }
}
