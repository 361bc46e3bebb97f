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
//!
//! Records are checked where they are read ([`parse_all`]): a line that
//! names a key but is not a usable record of it (a knob that is not an
//! integer, a field missing or out of range, knobs outside the space the
//! record itself lists) is [`Invalid`], kept apart and counted, never
//! adopted. A kernel's reader checks the rest against the kernel's own
//! tunables ([`for_kernel`]): a knob the kernel does not have, or a value
//! outside its candidates, is invalid too. `merge` and `prune` drop what is
//! invalid; they have no kernel, so they check each record against the
//! space it lists (`tune` writes it), and older records without one only
//! for their form.

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
    /// The space the knobs were chosen from (each tunable's candidates, by
    /// name), as `tune` saw it; `None` in records written before texc
    /// recorded it. Lets `merge` and `prune`, which have no kernel, drop a
    /// record whose knobs are not a point of it.
    pub space: Option<Table>,
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
        let mut line = json!({
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
        });
        if let Some(space) = &self.space {
            let space: serde_json::Map<String, Value> = space.iter().map(|(n, c)| (n.clone(), json!(c))).collect();
            line["space"] = Value::Object(space);
        }
        line.to_string()
    }

    /// A valid record from one line; `None` for anything else ([`parse_line`]).
    pub fn from_line(line: &str) -> Option<Record> {
        match parse_line(line) {
            Line::Record(r) => Some(*r),
            Line::Invalid(_) | Line::Damaged => None,
        }
    }

    /// The record's knobs checked against the space it lists, if it lists one.
    fn check_own_space(&self) -> Result<(), String> {
        self.space.as_ref().map_or(Ok(()), |space| check_knobs(&self.knobs, space))
    }
}

/// A line that names a key but is not a usable record of it, and why.
#[derive(Clone, Debug, PartialEq)]
pub struct Invalid {
    pub key: Key,
    pub reason: String,
}

/// What a line of a database is.
#[derive(Clone, Debug, PartialEq)]
pub enum Line {
    /// Boxed: a record is several times the size of the other cases.
    Record(Box<Record>),
    /// A record of a key that cannot be used ([`Invalid`]).
    Invalid(Invalid),
    /// Not a record: not JSON, a torn last line, another format version, no key.
    Damaged,
}

/// Read one line: a record, an invalid record of a key, or a damaged line.
pub fn parse_line(line: &str) -> Line {
    let Ok(v) = serde_json::from_str::<Value>(line) else { return Line::Damaged };
    if v.get("v").and_then(Value::as_i64) != Some(RECORD_VERSION) {
        return Line::Damaged;
    }
    let s = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_string);
    let (Some(target), Some(machine), Some(kernel_hash)) = (s("target"), s("machine"), s("kernel_hash")) else {
        return Line::Damaged;
    };
    let key = Key { target, machine, kernel_hash };
    match record_of(&v, key.clone()).and_then(|r| r.check_own_space().map(|()| r)) {
        Ok(r) => Line::Record(Box::new(r)),
        Err(reason) => Line::Invalid(Invalid { key, reason }),
    }
}

/// The record `v` holds for `key`, or the first reason it holds none.
fn record_of(v: &Value, key: Key) -> Result<Record, String> {
    let s = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_string).ok_or(format!("it has no `{k}` text"));
    let m = v.get("measured").ok_or("it has no `measured`")?;
    let u = |k: &str| m.get(k).and_then(Value::as_u64).ok_or(format!("its `measured.{k}` is not a count"));
    let time_ms = v
        .get("time_ms")
        .and_then(Value::as_f64)
        .filter(|t| t.is_finite() && *t >= 0.0)
        .ok_or("its `time_ms` is not a time")?;
    let space = match v.get("space") {
        None | Some(Value::Null) => None,
        Some(table) => Some(space_of(table)?),
    };
    Ok(Record {
        key,
        kernel: s("kernel")?,
        texc_version: s("texc")?,
        knobs: knobs_of(v.get("knobs"))?,
        space,
        schedule: s("schedule")?,
        time_ms,
        measured: Measured {
            runs: u("runs")?,
            warmup: u("warmup")?,
            threads: u("threads")?,
            duel: m.get("duel").and_then(Duel::from_json),
        },
        unix_time: v.get("unix_time").and_then(Value::as_u64).ok_or("its `unix_time` is not a time")?,
        plan: v.get("plan").and_then(PlanRun::from_json),
    })
}

/// Knob values by name, sorted; each must be a 64-bit integer (a float,
/// string or null is a reason, not a knob).
fn knobs_of(v: Option<&Value>) -> Result<Vec<(String, i64)>, String> {
    let map = v.and_then(Value::as_object).ok_or("its `knobs` are not an object")?;
    let mut knobs = map
        .iter()
        .map(|(n, x)| x.as_i64().map(|x| (n.clone(), x)).ok_or_else(|| format!("knob `{n}` = {x} is not an integer")))
        .collect::<Result<Vec<_>, String>>()?;
    knobs.sort();
    Ok(knobs)
}

/// A record's `space`: candidates by tunable name, each a list of integers.
fn space_of(v: &Value) -> Result<Table, String> {
    let bad = || "its `space` is not a list of integers per tunable".to_string();
    let map = v.as_object().ok_or_else(bad)?;
    map.iter()
        .map(|(n, c)| {
            let list = c.as_array().ok_or_else(bad)?;
            Ok((n.clone(), list.iter().map(Value::as_i64).collect::<Option<Vec<i64>>>().ok_or_else(bad)?))
        })
        .collect()
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

/// Records read from a file: the valid ones, the invalid ones apart
/// ([`Invalid`]: never adopted, counted where their kernel is read), and
/// how many lines were not records at all.
#[derive(Debug, Default)]
pub struct Loaded {
    pub records: Vec<Record>,
    pub invalid: Vec<Invalid>,
    pub skipped: usize,
}

/// Every line of a database, checked: the one place records are read.
fn parse_all(text: &str) -> Loaded {
    let mut out = Loaded::default();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        match parse_line(line) {
            Line::Record(r) => out.records.push(*r),
            Line::Invalid(i) => out.invalid.push(i),
            Line::Damaged => out.skipped += 1,
        }
    }
    out
}

/// Records that were dropped as invalid: how many, and the first one's reason.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Dropped {
    pub count: usize,
    pub first: Option<String>,
}

impl Dropped {
    fn add(&mut self, reason: &str) {
        self.count += 1;
        if self.first.is_none() {
            self.first = Some(reason.to_string());
        }
    }

    /// `skipped 3 invalid records (knob `ti` = 3 is not one of its candidates [4, 2, 8])`, `for_what`
    /// after "records"; `None` when none was dropped.
    pub fn note(&self, for_what: &str) -> Option<String> {
        let first = self.first.as_deref()?;
        let plural = if self.count == 1 { "" } else { "s" };
        Some(format!("skipped {} invalid record{plural}{for_what} (the first: {first})", self.count))
    }
}

/// One kernel's records, checked against its tunables.
#[derive(Clone, Debug, Default)]
pub struct KernelRecords {
    /// Valid records of the kernel's key.
    pub records: Vec<Record>,
    /// Records of the key that were skipped: invalid as read, or with a knob
    /// the kernel does not have or a value outside its candidates.
    pub invalid: Dropped,
}

impl KernelRecords {
    /// The best valid record ([`best_of`]).
    pub fn best(&self) -> Option<Record> {
        best_of(self.records.iter().cloned())
    }
}

/// The records of `key` in `loaded` whose knobs are a point of `space` (the
/// kernel's tunables and their candidates); the others are counted. This is
/// where `run`, `bench`, `compile` and `tune` read a kernel's records: a
/// record outside the kernel's space (`ti=3` where the template lists 4, 2,
/// 8; zero, negative, huge or unknown knobs) is never adopted, crowned or
/// fatal.
pub fn for_kernel(loaded: &Loaded, key: &Key, space: &[(String, Vec<i64>)]) -> KernelRecords {
    let mut out = KernelRecords::default();
    for i in loaded.invalid.iter().filter(|i| &i.key == key) {
        out.invalid.add(&i.reason);
    }
    for r in loaded.records.iter().filter(|r| &r.key == key) {
        match check_knobs(&r.knobs, space) {
            Ok(()) => out.records.push(r.clone()),
            Err(reason) => out.invalid.add(&reason),
        }
    }
    out
}

/// A space: each tunable's name and candidates.
pub type Table = Vec<(String, Vec<i64>)>;

/// Whether `knobs` is a point of `space`: every knob a tunable of it, every
/// value one of that tunable's candidates; the first reason it is not.
pub fn check_knobs(knobs: &[(String, i64)], space: &[(String, Vec<i64>)]) -> Result<(), String> {
    for (name, value) in knobs {
        let Some((_, candidates)) = space.iter().find(|(n, _)| n == name) else {
            let names: Vec<&str> = space.iter().map(|(n, _)| n.as_str()).collect();
            let known = if names.is_empty() { "none".to_string() } else { names.join(", ") };
            return Err(format!("knob `{name}` is not a tunable of the kernel (its tunables: {known})"));
        };
        if !candidates.contains(value) {
            let list: Vec<String> = candidates.iter().map(|c| c.to_string()).collect();
            return Err(format!("knob `{name}` = {value} is not one of its candidates [{}]", list.join(", ")));
        }
    }
    Ok(())
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

/// Records of several databases as one: identical lines once. Invalid
/// records ([`Loaded::invalid`]) are not carried over; they are counted.
pub fn merge(inputs: &[Loaded]) -> (Vec<Record>, Dropped) {
    let mut dropped = Dropped::default();
    for i in inputs.iter().flat_map(|l| &l.invalid) {
        dropped.add(&i.reason);
    }
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::new();
    for r in inputs.iter().flat_map(|l| &l.records) {
        if seen.insert(r.to_line()) {
            out.push(r.clone());
        }
    }
    sort(&mut out);
    (out, dropped)
}

/// The best record of each key ([`best_of`]), and of each key only those
/// of this texc version when `current` is given. Only valid records
/// compete: `loaded`'s invalid ones are dropped (and counted), so that an
/// invalid record, however fast it claims to be, never displaces the valid
/// best of its key. Without the kernel, validity is judged by the spaces
/// the key's records list (`tune` writes them): a record that lists none
/// (written by an older texc, or by hand) must be a point of one of them
/// when there are any. A key whose records list different spaces (its
/// template's `tune` lists changed) keeps the best of each, so that the
/// template in use still finds its own.
pub fn prune(loaded: Loaded, current: Option<&str>) -> (Vec<Record>, Dropped) {
    use std::collections::BTreeMap;
    let mut dropped = Dropped::default();
    for i in &loaded.invalid {
        dropped.add(&i.reason);
    }
    let mut by_key: BTreeMap<Key, Vec<Record>> = BTreeMap::new();
    for r in loaded.records.into_iter().filter(|r| current.is_none_or(|v| r.texc_version == v)) {
        by_key.entry(r.key.clone()).or_default().push(r);
    }
    let mut kept = Vec::new();
    for records in by_key.into_values() {
        let spaces: Vec<Table> = records.iter().filter_map(|r| r.space.clone()).collect();
        let mut by_space: BTreeMap<Option<Table>, Vec<Record>> = BTreeMap::new();
        for r in records {
            match fits_one(&r.knobs, &spaces) {
                Err(reason) if r.space.is_none() => dropped.add(&reason),
                _ => by_space.entry(r.space.clone()).or_default().push(r),
            }
        }
        kept.extend(by_space.into_values().filter_map(|rs| best_of(rs.into_iter())));
    }
    sort(&mut kept);
    (kept, dropped)
}

/// Whether `knobs` is a point of one of `spaces` (of any, when there are none).
fn fits_one(knobs: &[(String, i64)], spaces: &[Table]) -> Result<(), String> {
    match spaces.iter().map(|s| check_knobs(knobs, s)).find(Result::is_ok) {
        Some(_) => Ok(()),
        None if spaces.is_empty() => Ok(()),
        None => Err(check_knobs(knobs, &spaces[0]).expect_err("fits none")),
    }
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
            space: None,
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
        let space = vec![("ti".to_string(), vec![2, 4, 8])];
        assert_eq!(for_kernel(&l, &key, &space).best().map(|r| r.knobs), Some(vec![("ti".into(), 8)]));
        let (pruned, dropped) = prune(l, Some("0.1.0"));
        assert_eq!((pruned.len(), dropped.count), (1, 0));
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
        let (pruned, _) = prune(Loaded { records: rs, ..Loaded::default() }, None);
        assert_eq!((pruned.len(), pruned[0].knobs[0].1), (1, 4));
        assert!(pruned[0].measured.duel.as_ref().is_some_and(|d| d.won));
    }

    #[test]
    fn merge_keeps_each_record_once_in_a_stable_order() {
        let a = Loaded { records: vec![rec("b", 1.0, 2), rec("a", 3.0, 4)], ..Loaded::default() };
        let b = Loaded { records: vec![rec("a", 3.0, 4), rec("a", 2.0, 8)], ..Loaded::default() };
        let (m, _) = merge(&[a, b]);
        let got: Vec<(String, i64)> = m.iter().map(|r| (r.key.kernel_hash.clone(), r.knobs[0].1)).collect();
        assert_eq!(got, vec![("a".into(), 8), ("a".into(), 4), ("b".into(), 2)]);
    }

    /// A line of `r` with its knobs replaced by the JSON `knobs`.
    fn with_knobs(r: &Record, knobs: Value) -> String {
        let mut v: Value = serde_json::from_str(&r.to_line()).expect("json");
        v["knobs"] = knobs;
        v.to_string()
    }

    /// Issue 35, item 8: a record of the kernel's key whose knob is outside
    /// its candidates, zero, negative, 2^62, unknown, a float, a string or
    /// null is skipped and counted, never the best; the valid records of
    /// the key still are.
    #[test]
    fn invalid_records_are_skipped_and_counted() {
        let space = vec![("ti".to_string(), vec![4, 2, 8]), ("tk".to_string(), vec![4, 8])];
        let good = rec("a", 2.0, 4);
        let bad_values = [
            (json!({"ti": 3}), "knob `ti` = 3 is not one of its candidates [4, 2, 8]"),
            (json!({"ti": 0}), "knob `ti` = 0 is not one of its candidates"),
            (json!({"ti": -4}), "knob `ti` = -4 is not one of its candidates"),
            (json!({"ti": 1i64 << 62}), "knob `ti` = 4611686018427387904 is not one of its candidates"),
            (json!({"ti": 4, "tq": 2}), "knob `tq` is not a tunable of the kernel (its tunables: ti, tk)"),
            (json!({"ti": 4.0}), "knob `ti` = 4.0 is not an integer"),
            (json!({"ti": 4.5}), "knob `ti` = 4.5 is not an integer"),
            (json!({"ti": "4"}), "knob `ti` = \"4\" is not an integer"),
            (json!({"ti": null}), "knob `ti` = null is not an integer"),
            (json!({"ti": u64::MAX}), "knob `ti` = 18446744073709551615 is not an integer"),
            (json!([4]), "its `knobs` are not an object"),
        ];
        for (knobs, why) in bad_values {
            // The invalid record claims to be a thousand times faster.
            let bad = with_knobs(&rec("a", 0.002, 4), knobs.clone());
            let text = format!("{}\n{bad}\n", good.to_line());
            let l = parse_all(&text);
            let mine = for_kernel(&l, &good.key, &space);
            assert_eq!(mine.records, vec![good.clone()], "{knobs}");
            assert_eq!(mine.best(), Some(good.clone()), "{knobs}");
            assert_eq!(mine.invalid.count, 1, "{knobs}");
            let first = mine.invalid.first.clone().expect("a reason");
            assert!(first.starts_with(why), "{knobs}: {first}");
            assert!(mine.invalid.note(" for this kernel").is_some_and(|n| n.contains(why)), "{knobs}");
            // Another kernel's reader does not count them.
            let other = Key { kernel_hash: "b".into(), ..good.key.clone() };
            assert_eq!(for_kernel(&l, &other, &space).invalid.count, 0);
        }
    }

    /// A record that lists its space (as `tune` writes them) is checked
    /// against it where no kernel is known: `merge` and `prune` drop one
    /// whose knobs are not a point of it, and keep the valid best.
    #[test]
    fn merge_and_prune_drop_invalid_records() {
        let space = vec![("ti".to_string(), vec![4, 2, 8])];
        let listed = |ms: f64, ti: i64| Record { space: Some(space.clone()), ..rec("a", ms, ti) };
        let (good, slow) = (listed(2.0, 4), listed(3.0, 8));
        assert_eq!(Record::from_line(&good.to_line()), Some(good.clone()), "the space round-trips");
        let forged = listed(0.001, 3).to_line();
        let float = with_knobs(&listed(0.001, 4), json!({"ti": 2.5}));
        let text = [good.to_line(), slow.to_line(), forged, float, "{\"torn".into()].join("\n");
        let l = parse_all(&text);
        assert_eq!((l.records.len(), l.invalid.len(), l.skipped), (2, 2, 1));
        let (pruned, dropped) = prune(l, None);
        assert_eq!(pruned, vec![good.clone()], "the valid best is kept");
        assert_eq!(dropped.count, 2);
        assert!(dropped.first.as_deref().is_some_and(|f| f.contains("`ti` = 3 is not one of its candidates")));
        let (merged, dropped) = merge(&[parse_all(&text)]);
        assert_eq!((merged.len(), dropped.count), (2, 2));
    }

    /// A record without a space (an older texc's, or written by hand) is
    /// judged by `prune` against the spaces its key's records list; a key
    /// whose records list two spaces keeps the best of each.
    #[test]
    fn prune_judges_records_without_a_space_by_their_keys() {
        let space = vec![("ti".to_string(), vec![4, 2, 8])];
        let listed = |ms: f64, ti: i64| Record { space: Some(space.clone()), ..rec("a", ms, ti) };
        let l = Loaded { records: vec![listed(2.0, 4), rec("a", 0.001, 3), rec("a", 1.5, 8)], ..Loaded::default() };
        let (kept, dropped) = prune(l, None);
        let knobs: Vec<i64> = kept.iter().map(|r| r.knobs[0].1).collect();
        assert_eq!(knobs, [8, 4], "the best of those without a space, and of those with one");
        assert_eq!(dropped.count, 1);
        assert!(dropped.first.as_deref().is_some_and(|f| f.contains("`ti` = 3 is not one of its candidates")));
        // Only records without a space: nothing to judge them by but their form.
        let l = Loaded { records: vec![rec("a", 0.001, 3), rec("a", 1.5, 8)], ..Loaded::default() };
        assert_eq!(prune(l, None).0.len(), 1);
        // The template's lists changed: the best under each space is kept.
        let other = vec![("ti".to_string(), vec![4, 16])];
        let l = Loaded {
            records: vec![listed(2.0, 4), listed(1.0, 8), Record { space: Some(other.clone()), ..rec("a", 3.0, 16) }],
            ..Loaded::default()
        };
        let (kept, _) = prune(l, None);
        let knobs: Vec<i64> = kept.iter().map(|r| r.knobs[0].1).collect();
        assert_eq!(knobs, [8, 16]);
    }

    /// Property: whatever a line's knobs are (random names, integers of
    /// every size, floats, strings, nulls, arrays), reading it never
    /// panics, and a record of the kernel is adopted only when every knob
    /// is one of the kernel's tunables with one of its candidates.
    #[test]
    fn only_points_of_the_space_are_ever_adopted() {
        let space = vec![("ti".to_string(), vec![4, 2, 8]), ("tj".to_string(), vec![16, 32])];
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let (mut adopted, mut skipped) = (0, 0);
        for _ in 0..5000 {
            let mut knobs = serde_json::Map::new();
            for _ in 0..next() % 3 {
                let name = ["ti", "tj", "tk", ""][(next() % 4) as usize];
                let value = match next() % 9 {
                    0 => json!(next() as i64),
                    1 => json!(-((next() % 10) as i64)),
                    2 => json!((next() % 10) as f64 + 0.5),
                    3 => json!("4"),
                    4 => Value::Null,
                    5 => json!([4]),
                    6 => json!(next()),
                    _ => json!([4, 2, 8, 16, 32, 0, 3][(next() % 7) as usize]),
                };
                knobs.insert(name.to_string(), value);
            }
            let line = with_knobs(&rec("a", 1.0, 4), Value::Object(knobs.clone()));
            let l = parse_all(&line);
            let mine = for_kernel(&l, &rec("a", 1.0, 4).key, &space);
            let valid = knobs
                .iter()
                .all(|(n, v)| v.as_i64().is_some_and(|x| space.iter().any(|(m, c)| m == n && c.contains(&x))));
            assert_eq!(mine.records.len(), valid as usize, "{line}");
            assert_eq!(mine.invalid.count, !valid as usize, "{line}");
            if valid {
                adopted += 1;
            } else {
                skipped += 1;
            }
        }
        assert!(adopted > 100 && skipped > 100, "{adopted} adopted, {skipped} skipped");
    }
}
