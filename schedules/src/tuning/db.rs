//! The tuning database: one JSON object per line, appended and never
//! rewritten in place.
//!
//! A record says: on this target and machine, this kernel (by [`Key`]: a
//! hash of its specialized program as written, its schedule template and
//! texc's version) with this schedule ran in this time, measured so. Appends
//! take an exclusive lock on the file, write one whole line and `fsync`: two
//! tuners may append at once, and a tuner killed at any moment leaves at
//! most one torn last line, which readers skip and the next append
//! terminates. Rewrites (`merge`, `prune`) write a new file beside the old
//! and rename it over, under the lock.
//!
//! A key's best record is the fastest, unless the key has head-to-head
//! records (`measured.duel`: a tuning's winner timed again in alternating
//! rounds against the schedule it would replace, both sides recorded under
//! one id, the winner marked): then it is the winner of the latest
//! head-to-head. A single trial's time on a noisy machine is one draw, and
//! the fastest of many draws is often the luckiest.

use serde_json::{json, Value};
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use texc_runtime::atomic::Destination;

/// Format version of a record line.
pub const RECORD_VERSION: i64 = 1;

/// What a record is about: target, machine, kernel. Records of one key
/// are measurements of alternative schedules of the same computation.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key {
    pub target: String,
    /// CPU model and a hash of its feature flags (or the GPU's SM).
    pub machine: String,
    /// Hash of the specialized program, the schedule template and texc's version.
    pub kernel_hash: String,
}

/// How a time was measured.
#[derive(Clone, Debug, PartialEq)]
pub struct Measured {
    pub runs: u64,
    pub warmup: u64,
    pub threads: u64,
    /// One side of a head-to-head (its time the median of the rounds'
    /// medians); `None` for a trial.
    pub duel: Option<Duel>,
}

/// One side of a head-to-head.
#[derive(Clone, Debug, PartialEq)]
pub struct Duel {
    /// The same on both sides; unique to the head-to-head (time and process).
    pub id: String,
    pub rounds: u64,
    pub won: bool,
}

impl Duel {
    /// A fresh id: nanoseconds since the epoch and the process id.
    pub fn fresh_id() -> String {
        let ns = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        format!("{ns:x}-{}", std::process::id())
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Record {
    pub key: Key,
    /// The kernel's name (for people; the hash identifies it).
    pub kernel: String,
    pub texc_version: String,
    /// Tunable values of the schedule template.
    pub knobs: Vec<(String, i64)>,
    /// The schedule with those values, as `.tex` text ready to paste.
    pub schedule: String,
    /// Median time of the timed runs, in milliseconds.
    pub time_ms: f64,
    pub measured: Measured,
    pub unix_time: u64,
    /// The e-graph's plan that ran, where it chose one: its operators and
    /// its estimated time (calibrates the cost model, `texc_pipeline::tuning`).
    pub plan: Option<PlanRun>,
}

/// The operators of a plan that ran, and the cost model's estimate of it
/// in ns on the target's nominal machine.
#[derive(Clone, Debug, PartialEq)]
pub struct PlanRun {
    pub ops: Vec<String>,
    pub estimated_ns: f64,
}

impl Record {
    pub fn to_line(&self) -> String {
        let knobs: serde_json::Map<String, Value> = self.knobs.iter().map(|(n, v)| (n.clone(), json!(v))).collect();
        json!({
            "v": RECORD_VERSION,
            "target": self.key.target,
            "machine": self.key.machine,
            "kernel_hash": self.key.kernel_hash,
            "kernel": self.kernel,
            "texc": self.texc_version,
            "knobs": knobs,
            "schedule": self.schedule,
            "time_ms": self.time_ms,
            "measured": self.measured.to_json(),
            "unix_time": self.unix_time,
            "plan": self.plan.as_ref().map(|p| json!({"ops": p.ops, "estimated_ns": p.estimated_ns})),
        })
        .to_string()
    }

    /// A record from one line; `None` for anything else (a torn or foreign line).
    pub fn from_line(line: &str) -> Option<Record> {
        let v: Value = serde_json::from_str(line).ok()?;
        if v.get("v")?.as_i64()? != RECORD_VERSION {
            return None;
        }
        let s = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_string);
        let m = v.get("measured")?;
        let u = |k: &str| m.get(k).and_then(Value::as_u64);
        let mut knobs: Vec<(String, i64)> = v
            .get("knobs")?
            .as_object()?
            .iter()
            .map(|(n, x)| x.as_i64().map(|x| (n.clone(), x)))
            .collect::<Option<_>>()?;
        knobs.sort();
        let time_ms = v.get("time_ms")?.as_f64().filter(|t| t.is_finite() && *t >= 0.0)?;
        Some(Record {
            key: Key { target: s("target")?, machine: s("machine")?, kernel_hash: s("kernel_hash")? },
            kernel: s("kernel")?,
            texc_version: s("texc")?,
            knobs,
            schedule: s("schedule")?,
            time_ms,
            measured: Measured {
                runs: u("runs")?,
                warmup: u("warmup")?,
                threads: u("threads")?,
                duel: m.get("duel").and_then(Duel::from_json),
            },
            unix_time: v.get("unix_time")?.as_u64()?,
            plan: v.get("plan").and_then(PlanRun::from_json),
        })
    }
}

impl Measured {
    fn to_json(&self) -> Value {
        let mut m = json!({"stat": "median", "runs": self.runs, "warmup": self.warmup, "threads": self.threads});
        if let Some(d) = &self.duel {
            m["stat"] = json!("median of alternating rounds");
            m["duel"] = json!({"id": d.id, "rounds": d.rounds, "won": d.won});
        }
        m
    }
}

impl Duel {
    fn from_json(v: &Value) -> Option<Duel> {
        Some(Duel {
            id: v.get("id")?.as_str()?.to_string(),
            rounds: v.get("rounds")?.as_u64()?,
            won: v.get("won")?.as_bool()?,
        })
    }
}

impl PlanRun {
    pub fn from_json(v: &Value) -> Option<PlanRun> {
        let ops = v.get("ops")?.as_array()?.iter().map(|o| o.as_str().map(str::to_string)).collect::<Option<_>>()?;
        let estimated_ns = v.get("estimated_ns")?.as_f64().filter(|t| t.is_finite() && *t > 0.0)?;
        Some(PlanRun { ops, estimated_ns })
    }
}

/// Records read from a file, and how many lines were not records.
#[derive(Debug, Default)]
pub struct Loaded {
    pub records: Vec<Record>,
    pub skipped: usize,
}

fn parse_all(text: &str) -> Loaded {
    let mut out = Loaded::default();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        match Record::from_line(line) {
            Some(r) => out.records.push(r),
            None => out.skipped += 1,
        }
    }
    out
}

/// A tuning database file.
#[derive(Clone, Debug)]
pub struct Db {
    pub path: PathBuf,
}

/// Largest database texc reads (a bound, like every input's).
pub const MAX_DB_BYTES: u64 = 1 << 30;

impl Db {
    pub fn new(path: impl Into<PathBuf>) -> Db {
        Db { path: path.into() }
    }

    /// `TEXC_TUNING_DB`, else `$XDG_CACHE_HOME/texc/tuning.jsonl`, else `~/.cache/texc/tuning.jsonl`.
    pub fn default_path() -> PathBuf {
        if let Some(p) = std::env::var_os("TEXC_TUNING_DB") {
            return PathBuf::from(p);
        }
        let cache = std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
            .unwrap_or_else(std::env::temp_dir);
        cache.join("texc").join("tuning.jsonl")
    }

    fn open_locked(&self, exclusive: bool) -> std::io::Result<File> {
        if let Some(dir) = self.path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        let f = OpenOptions::new().read(true).append(true).create(true).open(&self.path)?;
        // A FIFO opened so does not block (Linux), but reading it would wait
        // for a writer forever: a database is a regular file.
        let m = f.metadata()?;
        if !m.is_file() {
            return Err(std::io::Error::other(format!("{} is not a regular file", self.path.display())));
        }
        if exclusive {
            f.lock()?;
        } else {
            f.lock_shared()?;
        }
        Ok(f)
    }

    /// Every record (a missing file has none).
    pub fn load(&self) -> std::io::Result<Loaded> {
        if !self.path.exists() {
            return Ok(Loaded::default());
        }
        let f = self.open_locked(false)?;
        read_bounded(&f, &self.path).map(|t| parse_all(&t))
    }

    /// Append one record: locked, one whole line, synced.
    pub fn append(&self, r: &Record) -> std::io::Result<()> {
        let mut f = self.open_locked(true)?;
        let len = f.metadata()?.len();
        let mut line = String::new();
        if len > 0 {
            // A tuner killed mid-write left a line without its newline: end it
            // (readers skip it) rather than glue this record onto it.
            let mut last = [0u8; 1];
            f.seek(SeekFrom::Start(len - 1))?;
            f.read_exact(&mut last)?;
            if last[0] != b'\n' {
                line.push('\n');
            }
        }
        line.push_str(&r.to_line());
        line.push('\n');
        f.write_all(line.as_bytes())?;
        f.sync_data()
    }

    /// Replace the file's records by `records` (sorted, one per line),
    /// atomically, under the lock. A FIFO or device (`db merge -o
    /// /dev/stdout`) is written through, unlocked, and stays what it is
    /// ([`texc_runtime::atomic`]).
    pub fn rewrite(&self, mut records: Vec<Record>) -> std::io::Result<()> {
        let _lock = match texc_runtime::atomic::destination(&self.path)? {
            Destination::Replace { .. } => Some(self.open_locked(true)?),
            Destination::Through { .. } => None,
        };
        sort(&mut records);
        let mut text = String::new();
        for r in &records {
            text.push_str(&r.to_line());
            text.push('\n');
        }
        texc_runtime::atomic::write(&self.path, text.as_bytes())
    }

    /// The fastest record of `key`.
    pub fn best(&self, key: &Key) -> std::io::Result<Option<Record>> {
        Ok(best_of(self.load()?.records.into_iter().filter(|r| &r.key == key)))
    }
}

fn read_bounded(f: &File, path: &Path) -> std::io::Result<String> {
    let mut bytes = Vec::new();
    f.take(MAX_DB_BYTES + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_DB_BYTES {
        return Err(std::io::Error::other(format!("{} is larger than 1 GiB", path.display())));
    }
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// Records in a stable order: by key, then time, then knobs.
pub fn sort(records: &mut [Record]) {
    records.sort_by(|a, b| {
        (&a.key, &a.kernel).cmp(&(&b.key, &b.kernel)).then(a.time_ms.total_cmp(&b.time_ms)).then(a.knobs.cmp(&b.knobs))
    });
}

/// The best of one key's `records`: the winner of the latest head-to-head
/// (by time, then id) if there is one, else the fastest (ties: the earliest).
pub fn best_of(records: impl Iterator<Item = Record>) -> Option<Record> {
    let records: Vec<Record> = records.collect();
    let latest = records.iter().filter_map(|r| r.measured.duel.as_ref().map(|d| (r.unix_time, d.id.clone()))).max();
    let fastest = |rs: Vec<Record>| {
        rs.into_iter().min_by(|a, b| a.time_ms.total_cmp(&b.time_ms).then(a.unix_time.cmp(&b.unix_time)))
    };
    let Some((_, id)) = latest else { return fastest(records) };
    let sides: Vec<Record> =
        records.into_iter().filter(|r| r.measured.duel.as_ref().is_some_and(|d| d.id == id)).collect();
    match sides.iter().find(|r| r.measured.duel.as_ref().is_some_and(|d| d.won)) {
        Some(w) => Some(w.clone()),
        None => fastest(sides),
    }
}

/// The knobs that lost a head-to-head among `records`.
pub fn losers(records: &[Record]) -> std::collections::HashSet<Vec<(String, i64)>> {
    records.iter().filter(|r| r.measured.duel.as_ref().is_some_and(|d| !d.won)).map(|r| r.knobs.clone()).collect()
}

/// Records of several databases as one: identical lines once.
pub fn merge(inputs: &[Loaded]) -> Vec<Record> {
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::new();
    for r in inputs.iter().flat_map(|l| &l.records) {
        if seen.insert(r.to_line()) {
            out.push(r.clone());
        }
    }
    sort(&mut out);
    out
}

/// The best record of each key ([`best_of`]), and of each key only those of this texc version when `current` is given.
pub fn prune(records: Vec<Record>, current: Option<&str>) -> Vec<Record> {
    let mut by_key: std::collections::BTreeMap<Key, Vec<Record>> = std::collections::BTreeMap::new();
    for r in records.into_iter().filter(|r| current.is_none_or(|v| r.texc_version == v)) {
        by_key.entry(r.key.clone()).or_default().push(r);
    }
    by_key.into_values().filter_map(|rs| best_of(rs.into_iter())).collect()
}

/// FNV-1a, 64 bits: a stable hash (std's is not promised to stay the same across Rust versions).
pub fn stable_hash(bytes: &[u8]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// This machine, as tuning records name it: the CPU model and a hash of its feature flags.
pub fn this_machine() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let field = |name: &str| {
        info.lines()
            .find(|l| l.split(':').next().is_some_and(|k| k.trim() == name))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
    };
    let model = field("model name").unwrap_or_else(|| std::env::consts::ARCH.to_string());
    let flags = field("flags").unwrap_or_default();
    format!("{model} / flags {}", stable_hash(flags.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(hash: &str, ms: f64, ti: i64) -> Record {
        Record {
            key: Key { target: "x86-avx2".into(), machine: "m".into(), kernel_hash: hash.into() },
            kernel: "mm".into(),
            texc_version: "0.1.0".into(),
            knobs: vec![("ti".into(), ti)],
            schedule: format!("schedule mm for x86-avx2 {{\n    split C.i by {ti} -> (io, ii);\n}}"),
            time_ms: ms,
            measured: Measured { runs: 10, warmup: 2, threads: 1, duel: None },
            unix_time: 1,
            plan: None,
        }
    }

    #[test]
    fn lines_round_trip_and_torn_lines_are_skipped() {
        let r = rec("00aa", 1.5, 8);
        assert_eq!(Record::from_line(&r.to_line()), Some(r.clone()));
        let planned = Record { plan: Some(PlanRun { ops: vec!["conv2d".into()], estimated_ns: 2.5e5 }), ..r.clone() };
        assert_eq!(Record::from_line(&planned.to_line()), Some(planned));
        let line = r.to_line();
        let text = format!("{line}\n{}\n\n{line}", &line[..line.len() / 2]);
        let l = parse_all(&text);
        assert_eq!((l.records.len(), l.skipped), (2, 1));
    }

    #[test]
    fn appends_after_a_torn_line_stay_readable() {
        let dir = std::env::temp_dir().join(format!("texc-db-unit-{}", std::process::id()));
        let db = Db::new(dir.join("t.jsonl"));
        let _ = std::fs::remove_file(&db.path);
        db.append(&rec("a", 2.0, 4)).expect("append");
        // A writer killed mid-line.
        let mut f = OpenOptions::new().append(true).open(&db.path).expect("open");
        f.write_all(&rec("a", 0.1, 2).to_line().as_bytes()[..20]).expect("torn");
        db.append(&rec("a", 1.0, 8)).expect("append");
        let l = db.load().expect("load");
        assert_eq!((l.records.len(), l.skipped), (2, 1));
        let key = rec("a", 0.0, 0).key;
        assert_eq!(db.best(&key).expect("best").map(|r| r.knobs), Some(vec![("ti".into(), 8)]));
        let pruned = prune(l.records, Some("0.1.0"));
        assert_eq!(pruned.len(), 1);
        db.rewrite(pruned).expect("rewrite");
        assert_eq!(db.load().expect("load").records.len(), 1);
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn the_latest_head_to_head_decides_over_single_trials() {
        let side = |ms: f64, ti: i64, at: u64, id: &str, won: bool| Record {
            measured: Measured { duel: Some(Duel { id: id.into(), rounds: 3, won }), ..rec("a", 0.0, 0).measured },
            unix_time: at,
            ..rec("a", ms, ti)
        };
        // A lucky trial (ti=2 once at 0.5 ms) lost its head-to-head with ti=8.
        let mut rs = vec![rec("a", 0.5, 2), rec("a", 0.9, 8), side(0.8, 8, 5, "x", true), side(0.85, 2, 5, "x", false)];
        assert_eq!(best_of(rs.clone().into_iter()).map(|r| r.knobs[0].1), Some(8));
        assert_eq!(losers(&rs), [vec![("ti".to_string(), 2)]].into_iter().collect());
        let back = Record::from_line(&rs[3].to_line()).expect("a record");
        assert_eq!(back, rs[3]);
        // A later head-to-head in the same second, even one its winner won on
        // a tie (ti=4 kept at the same time as ti=16), replaces it.
        rs.extend([side(0.7, 4, 5, "y", true), side(0.7, 16, 5, "y", false)]);
        assert_eq!(best_of(rs.clone().into_iter()).map(|r| r.knobs[0].1), Some(4));
        // Without any, the fastest wins.
        assert_eq!(best_of(rs[..2].iter().cloned()).map(|r| r.knobs[0].1), Some(2));
        let pruned = prune(rs, None);
        assert_eq!((pruned.len(), pruned[0].knobs[0].1), (1, 4));
        assert!(pruned[0].measured.duel.as_ref().is_some_and(|d| d.won));
    }

    #[test]
    fn merge_keeps_each_record_once_in_a_stable_order() {
        let a = Loaded { records: vec![rec("b", 1.0, 2), rec("a", 3.0, 4)], skipped: 0 };
        let b = Loaded { records: vec![rec("a", 3.0, 4), rec("a", 2.0, 8)], skipped: 0 };
        let m = merge(&[a, b]);
        let got: Vec<(String, i64)> = m.iter().map(|r| (r.key.kernel_hash.clone(), r.knobs[0].1)).collect();
        assert_eq!(got, vec![("a".into(), 8), ("a".into(), 4), ("b".into(), 2)]);
    }
}
