//! `texc tune` and `texc db`: a schedule template's knobs searched in worker
//! processes, recorded in an append-only database that survives a killed
//! tuner and concurrent tuners, and used by `run`, `bench` and `compile`.

#[path = "../../tests/src/scratch.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("parent").to_path_buf()
}

fn tmp(name: &str) -> PathBuf {
    let d = common::scratch("tune-cli");
    std::fs::create_dir_all(&d).expect("tmp");
    d.join(name)
}

fn texc_cmd(db: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_texc"));
    c.args(args).current_dir(root()).env("TEXC_TUNING_DB", db).env("TEXC_NUM_THREADS", "1");
    c
}

fn texc(db: &Path, args: &[&str]) -> Output {
    texc_cmd(db, args).output().expect("texc runs")
}

fn text(o: &Output) -> (String, String) {
    (String::from_utf8_lossy(&o.stdout).to_string(), String::from_utf8_lossy(&o.stderr).to_string())
}

const TUNE: [&str; 8] =
    ["tune", "examples/tuned_matmul.tex", "--target", "x86-avx2", "--shape", "M=64,K=64,N=64", "--warmup", "1"];

fn tune(db: &Path, trials: usize, seed: u64) -> Output {
    let (t, s) = (trials.to_string(), seed.to_string());
    let mut args: Vec<&str> = TUNE.to_vec();
    args.extend(["--repeat", "3", "--trials", &t, "--seed", &s]);
    texc(db, &args)
}

fn records(db: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(db).unwrap_or_default().lines().filter_map(|l| serde_json::from_str(l).ok()).collect()
}

/// The records of trials (not of a closing head-to-head).
fn trials(db: &Path) -> Vec<serde_json::Value> {
    records(db).into_iter().filter(|r| r["measured"]["duel"].is_null()).collect()
}

#[test]
fn tunes_records_resumes_and_is_used_by_run() {
    let db = tmp("resume.jsonl");
    let o = tune(&db, 5, 1);
    let (out, e) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{e}");
    assert!(out.contains("tuned `mm` on x86-avx2 [M=64, K=64, N=64]: 5 trials"), "{out}");
    assert!(out.contains("default") && out.contains("best"), "{out}");
    let first = trials(&db);
    assert_eq!(first.len(), 5, "{out}\n{e}");
    // Candidate zero (each list's first value) is always measured first.
    assert_eq!(first[0]["knobs"], serde_json::json!({"ti": 4, "tj": 16, "tk": 4}));
    let best = first.iter().map(|r| r["time_ms"].as_f64().expect("time")).fold(f64::INFINITY, f64::min);
    assert!(best <= first[0]["time_ms"].as_f64().expect("time"));
    // A second tune continues: the first five are not measured again.
    let o = tune(&db, 9, 1);
    let (out, e) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{e}");
    assert!(out.contains("9 trials (4 measured now") && out.contains("5 from the database"), "{out}");
    let all = trials(&db);
    assert_eq!(all.len(), 9);
    let knobs: std::collections::HashSet<String> = all.iter().map(|r| r["knobs"].to_string()).collect();
    assert_eq!(knobs.len(), 9, "no candidate measured twice");
    // The schedule recorded is a block to paste: no tunables left.
    let sched = all[0]["schedule"].as_str().expect("schedule");
    assert!(
        sched.starts_with("schedule mm for x86-avx2 {") && !sched.contains('?') && !sched.contains("tune "),
        "{sched}"
    );
    // run takes the best knobs, says so, and stays right.
    let run = ["run", "examples/tuned_matmul.tex", "--target", "x86-avx2", "--shape", "M=64,K=64,N=64", "--check"];
    let o = texc(&db, &run);
    let (out, e) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{e}");
    assert!(e.contains("note: using tuned knobs") && out.contains("check `C` against interp"), "{e}{out}");
    let mut no_db = run.to_vec();
    no_db.push("--no-db");
    let o = texc(&db, &no_db);
    assert!(!text(&o).1.contains("tuned knobs"), "{}", text(&o).1);
    // Other sizes are another key: nothing to use.
    let o = texc(&db, &["run", "examples/tuned_matmul.tex", "--target", "x86-avx2", "--shape", "M=32,K=64,N=64"]);
    assert!(!text(&o).1.contains("tuned knobs"), "{}", text(&o).1);
    let o = texc(&db, &["db", "list"]);
    assert!(text(&o).0.contains("mm on x86-avx2") && text(&o).0.contains("9 trials"), "{}", text(&o).0);
}

/// The search's fastest trial is one measurement; before it replaces the
/// schedule in force it is timed again against it in alternating rounds,
/// and the database then keeps the faster side. Here a made-up trial
/// claims 1 ns: it is measured for real and cannot win on its claim.
#[test]
fn a_lucky_trial_must_win_a_head_to_head() {
    let db = tmp("head-to-head.jsonl");
    let o = tune(&db, 2, 1);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o).1);
    let mut lucky = trials(&db).into_iter().next().expect("a trial");
    lucky["knobs"] = serde_json::json!({"ti": 8, "tj": 64, "tk": 8});
    lucky["time_ms"] = serde_json::json!(1e-6);
    let mut body = std::fs::read_to_string(&db).expect("db");
    body.push_str(&format!("{lucky}\n"));
    std::fs::write(&db, body).expect("write");
    let o = tune(&db, 3, 1);
    let (out, e) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{e}");
    assert!(out.contains("head-to-head over 3 alternating rounds"), "{out}");
    let h2h: Vec<serde_json::Value> =
        records(&db).into_iter().filter(|r| r["measured"]["duel"]["rounds"] == 3).collect();
    let sides: Vec<String> = h2h.iter().map(|r| r["knobs"].to_string()).collect();
    assert!(sides.contains(&lucky["knobs"].to_string()), "{sides:?}");
    let last = &h2h[h2h.len() - 2..];
    assert_eq!(last[0]["measured"]["duel"]["id"], last[1]["measured"]["duel"]["id"], "one head-to-head");
    for r in last {
        assert!(r["time_ms"].as_f64().expect("time") > 1e-4, "measured for real: {r}");
    }
    let won: Vec<&serde_json::Value> = last.iter().filter(|r| r["measured"]["duel"]["won"] == true).collect();
    assert_eq!(won.len(), 1, "one winner: {last:?}");
    let winner_ms = format!("({:.4} ms when tuned)", won[0]["time_ms"].as_f64().expect("time"));
    if won[0]["knobs"] != lucky["knobs"] {
        // The lucky trial lost: it is not reported as the best any more.
        assert!(!out.contains("0.0000 ms"), "{out}");
    }
    let run = ["run", "examples/tuned_matmul.tex", "--target", "x86-avx2", "--shape", "M=64,K=64,N=64", "--check"];
    let o = texc(&db, &run);
    let (out, e) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{e}");
    assert!(e.contains(&winner_ms) && out.contains("check `C` against interp"), "{winner_ms}\n{e}");
}

#[test]
fn a_killed_tuner_loses_at_most_its_trial_in_flight() {
    let db = tmp("killed.jsonl");
    let mut args: Vec<&str> = TUNE.to_vec();
    args.extend(["--trials", "18", "--repeat", "200"]);
    let mut child = texc_cmd(&db, &args).stdout(Stdio::null()).stderr(Stdio::null()).spawn().expect("spawn");
    // Let it record a few trials, then kill -9.
    let start = std::time::Instant::now();
    while trials(&db).len() < 2 && start.elapsed().as_secs() < 60 {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.kill().expect("kill -9");
    child.wait().expect("reaped");
    let before = trials(&db).len();
    assert!(before >= 2, "records before the kill: {before}");
    // Simulate the worst moment: a record torn in the middle of its line.
    {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new().append(true).open(&db).expect("open");
        f.write_all(b"{\"v\":1,\"target\":\"x86-av").expect("torn line");
    }
    let o = tune(&db, 18, 0);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o).1);
    let o = texc(&db, &["db", "list"]);
    let (out, _) = text(&o);
    assert!(out.contains("1 damaged lines skipped") && out.contains(": 18 trials"), "{out}");
    assert_eq!(trials(&db).len(), 18);
}

#[test]
fn two_tuners_at_once_write_whole_records() {
    let db = tmp("concurrent.jsonl");
    let spawn = |seed: &str| {
        let mut args: Vec<&str> = TUNE.to_vec();
        args.extend(["--repeat", "3", "--trials", "6", "--seed", seed]);
        texc_cmd(&db, &args).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().expect("spawn")
    };
    let (a, b) = (spawn("1"), spawn("2"));
    for c in [a, b] {
        let o = c.wait_with_output().expect("waits");
        assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    }
    let text = std::fs::read_to_string(&db).expect("db");
    assert_eq!(text.lines().count(), records(&db).len(), "every line is a whole record:\n{text}");
    assert_eq!(trials(&db).len(), 12, "{text}");
}

#[test]
fn merge_prune_and_errors() {
    let (a, b, m) = (tmp("a.jsonl"), tmp("b.jsonl"), tmp("m.jsonl"));
    assert_eq!(tune(&a, 3, 1).status.code(), Some(0));
    assert_eq!(tune(&b, 4, 2).status.code(), Some(0));
    let o = texc(
        &a,
        &["db", "merge", a.to_str().expect("utf-8"), b.to_str().expect("utf-8"), "-o", m.to_str().expect("utf-8")],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o).1);
    let distinct: std::collections::HashSet<String> =
        records(&a).iter().chain(&records(&b)).map(|r| r.to_string()).collect();
    assert_eq!(records(&m).len(), distinct.len());
    let o = texc(&m, &["db", "prune"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o).1);
    assert_eq!(records(&m).len(), 1, "the fastest record of the one key");
    // Misuse and input errors.
    let o = texc(&m, &["db", "frob"]);
    assert_eq!(o.status.code(), Some(2));
    let o = texc(&m, &["tune", "examples/tuned_matmul.tex", "--target", "x86-avx2", "--knob", "ti=4"]);
    assert_eq!(o.status.code(), Some(2));
    // A schedule block without tunables pins the loop nest: nothing to tune.
    let o = texc(&m, &["tune", "examples/matmul.tex", "--target", "x86-avx2", "--trials", "2"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o).1.contains("nothing to tune"), "{}", text(&o).1);
    // A value outside a tunable's candidates is a spanned error at its `tune`.
    let o = texc(&m, &["run", "examples/tuned_matmul.tex", "--target", "x86-avx2", "--knob", "ti=3"]);
    let (_, e) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{e}");
    assert!(e.contains("not one of its candidates") && e.contains("tuned_matmul.tex:"), "{e}");
}

/// Issue 35, item 8: records of the kernel's key whose knobs are not a
/// point of its space (outside the candidates, zero, negative, 2^62, an
/// unknown name, a float, a string, null), each claiming 1 ns, are skipped
/// and counted by `run`, `bench`, `compile` and `tune`, never adopted or
/// crowned, and dropped by `db prune`, which keeps the valid best.
#[test]
fn invalid_records_are_skipped_everywhere() {
    let db = tmp("invalid.jsonl");
    let o = tune(&db, 2, 1);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o).1);
    let model = trials(&db).into_iter().next().expect("a trial");
    assert!(model["space"]["ti"] == serde_json::json!([4, 2, 8]), "tune records the space: {model}");
    let bad = [
        serde_json::json!(3),
        serde_json::json!(0),
        serde_json::json!(-4),
        serde_json::json!(1i64 << 62),
        serde_json::json!(4.5),
        serde_json::json!("4"),
        serde_json::Value::Null,
    ];
    let mut body = std::fs::read_to_string(&db).expect("db");
    let mut forged = |edit: &dyn Fn(&mut serde_json::Value)| {
        let mut r = model.clone();
        r["time_ms"] = serde_json::json!(1e-6);
        edit(&mut r);
        body.push_str(&format!("{r}\n"));
    };
    for v in &bad {
        forged(&|r| r["knobs"]["ti"] = v.clone());
    }
    forged(&|r| r["knobs"]["tq"] = serde_json::json!(2));
    // As an older texc wrote it: no space to judge it by but the kernel's.
    forged(&|r| {
        r["knobs"]["ti"] = serde_json::json!(3);
        r.as_object_mut().expect("object").remove("space");
    });
    std::fs::write(&db, body).expect("write");
    let skipped = "note: tuning database: skipped 9 invalid records of `mm` in";
    let sizes = ["--target", "x86-avx2", "--shape", "M=64,K=64,N=64"];
    let o = texc(&db, &[&["run", "examples/tuned_matmul.tex", "--check"][..], &sizes].concat());
    let (out, e) = text(&o);
    assert_eq!(o.status.code(), Some(0), "run: {e}");
    assert!(e.contains(skipped) && e.contains("note: using tuned knobs"), "{e}");
    assert!(!e.contains("ti=3") && out.contains("check `C` against interp"), "{e}{out}");
    let o =
        texc(&db, &[&["bench", "examples/tuned_matmul.tex", "--repeat", "1", "--warmup", "0"][..], &sizes].concat());
    assert_eq!(o.status.code(), Some(0), "bench: {}", text(&o).1);
    assert!(text(&o).1.contains(skipped), "{}", text(&o).1);
    let lib = tmp("invalid.so");
    let o =
        texc(&db, &[&["compile", "examples/tuned_matmul.tex", "-o", lib.to_str().expect("utf8")][..], &sizes].concat());
    assert_eq!(o.status.code(), Some(0), "compile: {}", text(&o).1);
    // tune does not crown them: no best of 0.0000 ms, no absurd speedup.
    let o = tune(&db, 4, 1);
    let (out, e) = text(&o);
    assert_eq!(o.status.code(), Some(0), "tune: {e}");
    assert!(e.contains(skipped), "{e}");
    let best = out.lines().find(|l| l.trim_start().starts_with("best")).expect("a best line");
    assert!(!best.contains(" 0.0000 ms") && !best.contains("ti=3"), "{out}");
    let o = texc(&db, &["db", "list"]);
    assert!(text(&o).0.contains("8 invalid records skipped"), "{}", text(&o).0);
    // prune drops them (and the one without a space, by its key's) and keeps a valid best.
    let o = texc(&db, &["db", "prune"]);
    let (out, e) = text(&o);
    assert_eq!(o.status.code(), Some(0), "prune: {e}");
    assert!(e.contains("skipped 9 invalid records (dropped)"), "{out}{e}");
    let left = records(&db);
    assert_eq!(left.len(), 1, "{left:?}");
    let ti = left[0]["knobs"]["ti"].as_i64();
    assert!(ti.is_none_or(|ti| [4, 2, 8].contains(&ti)) && left[0]["time_ms"].as_f64() > Some(1e-4), "{left:?}");
}

/// `--shard i/n` splits the candidate stream: the shards of one seed and
/// trial count, merged, measure exactly the candidates one unsplit run
/// (`--shard 0/1`) measures. (A space larger than --trials is sampled at
/// random when sharded, since evolving needs every measurement in one place.)
#[test]
fn shards_merged_equal_one_run() {
    let knob_set = |db: &Path| -> std::collections::BTreeSet<String> {
        records(db).iter().map(|r| r["knobs"].to_string()).collect()
    };
    let whole = tmp("whole.jsonl");
    let mut one: Vec<&str> = TUNE.to_vec();
    one.extend(["--repeat", "3", "--trials", "7", "--seed", "3", "--shard", "0/1"]);
    assert_eq!(texc(&whole, &one).status.code(), Some(0));
    assert_eq!(records(&whole).len(), 7);
    let mut parts = Vec::new();
    for i in 0..3 {
        let part = tmp(&format!("shard{i}.jsonl"));
        let shard = format!("{i}/3");
        let mut args: Vec<&str> = TUNE.to_vec();
        args.extend(["--repeat", "3", "--trials", "7", "--seed", "3", "--shard", &shard]);
        let o = texc(&part, &args);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o).1);
        parts.push(part);
    }
    let sizes: Vec<usize> = parts.iter().map(|p| records(p).len()).collect();
    assert_eq!(sizes, vec![3, 2, 2], "disjoint shards of 7 candidates");
    let merged = tmp("merged.jsonl");
    let mut args = vec!["db", "merge"];
    let names: Vec<String> = parts.iter().map(|p| p.display().to_string()).collect();
    args.extend(names.iter().map(String::as_str));
    let m = merged.display().to_string();
    args.extend(["-o", &m]);
    assert_eq!(texc(&merged, &args).status.code(), Some(0));
    assert_eq!(knob_set(&merged), knob_set(&whole));
    let mut bad: Vec<&str> = TUNE.to_vec();
    bad.extend(["--shard", "3/3"]);
    assert_eq!(texc(&merged, &bad).status.code(), Some(2));
}

/// A kernel without a schedule block is tuned through the default
/// schedule's knobs (`texc_schedules::knobs`); candidates whose loop nests
/// an earlier one already had are not measured again; the knobs are checked.
#[test]
fn kernels_without_a_template_tune_the_default_schedule() {
    let db = tmp("default.jsonl");
    let shape = ["--shape", "M=48,K=300,N=160"];
    let mut args = vec!["tune", "benches/matmul.tex", "--target", "x86-avx2", "--trials", "6", "--repeat", "2"];
    args.extend(shape);
    let o = texc(&db, &args);
    let (out, e) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{e}");
    assert!(out.contains("tuned `matmul`"), "{out}");
    let rs = trials(&db);
    assert!(!rs.is_empty() && rs.len() <= 6, "{out}\n{e}");
    assert_eq!(rs[0]["knobs"], serde_json::json!({}), "candidate zero is the default schedule itself");
    for r in &rs[1..] {
        let knobs = r["knobs"].as_object().expect("knobs");
        assert!(
            knobs.keys().all(|k| [
                "rows", "nvec", "kslice", "cols", "pack", "order", "unroll", "par", "vec", "attach", "follow", "racc",
                "recip", "acc", "flash", "fkeys", "fqueries", "rewrite", "winograd", "im2col", "prefetch", "forward"
            ]
            .contains(&k.as_str())),
            "{r}"
        );
        assert!(r["schedule"].as_str().expect("text").starts_with("# the default schedule with --knob "), "{r}");
    }
    // The knobs on the command line: checked, and the results stay right.
    let mut run = vec![
        "run",
        "benches/matmul.tex",
        "--target",
        "x86-avx2",
        "--check",
        "--no-db",
        "--knob",
        "rows=3,kslice=64,pack=0",
    ];
    run.extend(shape);
    let o = texc(&db, &run);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o).1);
    // The pipeline's knobs take their own values only: each refused outside them, as CLI misuse.
    for (knob, expected) in [
        ("winograd=5", "1, 0, 2, 3, 4"),
        ("rewrite=2", "1, 0"),
        ("im2col=-1", "1, 0"),
        ("prefetch=3", "1, 0"),
        ("forward=7", "1, 0"),
    ] {
        let mut odd = vec!["run", "benches/matmul.tex", "--target", "x86-avx2", "--knob", knob];
        odd.extend(shape);
        let o = texc(&db, &odd);
        assert_eq!(o.status.code(), Some(2), "{knob}: {}", text(&o).1);
        assert!(text(&o).1.contains(&format!("--knob {knob}: expected one of {expected}")), "{}", text(&o).1);
    }
    // The generated space's knobs are checked too: a value outside a knob's range is an error naming the ranges.
    for knob in ["racc=0", "nvec=5", "recip=2", "unroll=0", "order=3", "attach=7", "acc=2", "gtile=96", "stages=1"] {
        let mut out_of_range = vec!["run", "benches/matmul.tex", "--target", "x86-avx2", "--knob", knob];
        out_of_range.extend(shape);
        let o = texc(&db, &out_of_range);
        assert_eq!(o.status.code(), Some(1), "{knob}");
        assert!(text(&o).1.contains("is out of its range") && !text(&o).1.contains("panicked"), "{}", text(&o).1);
    }
    let mut bad = vec!["run", "benches/matmul.tex", "--target", "x86-avx2", "--knob", "tile=4"];
    bad.extend(shape);
    let o = texc(&db, &bad);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o).1.contains("not a knob of the default schedule (its knobs: rows, nvec, kslice, cols, pack, order, unroll, par, vec, attach, follow, racc, recip, acc, flash, fkeys, fqueries; on GPUs: gather, gtile, gslice, stages, wgmma; the pipeline's: rewrite, winograd, im2col)"),
        "{}",
        text(&o).1
    );
}

#[test]
fn plot_draws_the_best_time_per_trial() {
    let db = tmp("plot.jsonl");
    let svg = tmp("tune.svg");
    let s = svg.display().to_string();
    let mut args: Vec<&str> = TUNE.to_vec();
    args.extend(["--repeat", "2", "--trials", "4", "--plot", &s]);
    let o = texc(&db, &args);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o).1);
    let body = std::fs::read_to_string(&svg).expect("svg written");
    assert!(body.starts_with("<svg") && body.trim_end().ends_with("</svg>"), "{body}");
    let line = body.lines().find(|l| l.starts_with("<polyline")).expect("a line");
    assert_eq!(line.matches(',').count(), 4, "one point per trial: {line}");
}

/// A space larger than the trials is searched with the learned cost model
/// once it has seen enough trials: most later candidates are its picks, it
/// says how well its predictions ranked them, and `--no-model` searches
/// without it. Every tuned result matches the interpreter.
#[test]
fn the_cost_model_picks_candidates_in_large_spaces() {
    let shape = ["--shape", "M=40,K=96,N=72"];
    let base =
        ["tune", "benches/matmul.tex", "--target", "x86-avx2", "--trials", "16", "--repeat", "2", "--warmup", "1"];
    let db = tmp("model.jsonl");
    let mut args = base.to_vec();
    args.extend(shape);
    let o = texc(&db, &args);
    let (out, e) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{e}");
    let line = out.lines().find(|l| l.contains("cost model: chose")).unwrap_or_else(|| panic!("no model line:\n{out}"));
    let chosen: usize =
        line.split("chose ").nth(1).and_then(|r| r.split(' ').next()).and_then(|n| n.parse().ok()).expect("count");
    assert!(chosen >= 3, "the model chose {chosen} of 16 trials:\n{out}");
    let best = records(&db)
        .into_iter()
        .min_by(|a, b| a["time_ms"].as_f64().expect("t").total_cmp(&b["time_ms"].as_f64().expect("t")))
        .expect("records");
    let knobs: Vec<String> =
        best["knobs"].as_object().expect("knobs").iter().map(|(k, v)| format!("{k}={v}")).collect();
    let mut run = vec!["run", "benches/matmul.tex", "--target", "x86-avx2", "--check", "--no-db"];
    run.extend(shape);
    let joined = knobs.join(",");
    if !knobs.is_empty() {
        run.extend(["--knob", &joined]);
    }
    let o = texc(&db, &run);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o).1);
    // Without the model: no model line.
    let db = tmp("no-model.jsonl");
    let mut args = base.to_vec();
    args.extend(shape);
    args.push("--no-model");
    let o = texc(&db, &args);
    let (out, e) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{e}");
    assert!(!out.contains("cost model"), "{out}");
    // (It may stop early: most mutations here repeat a loop nest already measured.)
    let n = trials(&db).len();
    assert!((1..=16).contains(&n), "{n} records:\n{out}\n{e}");
}

/// `--jobs 2`: candidates compile two at a time and are timed one at a
/// time; a worker still compiling after `--trial-timeout` is killed and
/// loses only its trial (here every one: the tuner says none could be
/// measured, and records nothing). The second tune compiles without the
/// compile cache: the first one's code, read back from it, could come
/// within the timeout.
#[test]
fn candidates_compile_together_and_time_alone() {
    let db = tmp("jobs.jsonl");
    let mut args: Vec<&str> = TUNE.to_vec();
    args.extend(["--repeat", "3", "--trials", "6", "--jobs", "2"]);
    let o = texc(&db, &args);
    let (out, e) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{e}");
    assert!(out.contains("6 trials (6 measured now"), "{out}");
    assert_eq!(trials(&db).len(), 6, "{e}");
    let db = tmp("jobs_killed.jsonl");
    args.extend(["--trial-timeout", "0.001"]);
    let o = texc_cmd(&db, &args).env("TEXC_NO_CACHE", "1").output().expect("texc runs");
    let (out, e) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}\n{e}");
    assert!(e.contains("s compiling"), "{e}");
    assert!(e.contains("no candidate of `mm` could be measured"), "{out}\n{e}");
    assert!(records(&db).is_empty());
}

/// The tuner records which e-graph plan each candidate ran and the cost
/// model's estimate of it; `run`/`bench` correct the model by those of
/// this machine (relative to the other plans of the same kernel) before
/// choosing a plan, and say so. Here made-up measurements say that both
/// forms of Winograd F(2×2, 3×3) run 4–5× slower than the model thinks next
/// to a direct convolution: a layer of that size then runs direct — unless
/// it has a tuning record of its own.
#[test]
fn measured_plans_correct_the_cost_model() {
    let db = tmp("calibration.jsonl");
    let o = tune(&db, 1, 0);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o).1);
    let mut r = records(&db).into_iter().next().expect("a record");
    let plan_of = |args: &[&str]| {
        let mut all = vec!["bench", "benches/conv_layer.tex", "--target", "x86-avx2", "--shape"];
        all.extend(["C=256,H=14,W=14,K=256", "--repeat", "1", "--warmup", "0", "--json"]);
        all.extend(args);
        let o = texc(&db, &all);
        let (out, e) = text(&o);
        assert_eq!(o.status.code(), Some(0), "{e}");
        let v: serde_json::Value = serde_json::from_str(&out).expect("json");
        (v["plan"]["ops"].clone(), e)
    };
    let (nominal, _) = plan_of(&["--no-db"]);
    assert_eq!(nominal, serde_json::json!(["conv2d_winograd_f2k"]), "the model's own choice");
    let mut lines = Vec::new();
    let measured = [("conv2d", 1.6e6, 1.0), ("conv2d_winograd_f2", 1.2e6, 3.75), ("conv2d_winograd_f2k", 1.0e6, 3.75)];
    for (op, estimated_ns, ms) in measured {
        r["kernel_hash"] = serde_json::json!("calibration-test");
        r["time_ms"] = serde_json::json!(ms);
        r["plan"] = serde_json::json!({"ops": [op], "estimated_ns": estimated_ns});
        lines.push(r.to_string());
    }
    std::fs::write(&db, lines.join("\n") + "\n").expect("write");
    let (corrected, e) = plan_of(&[]);
    assert!(e.contains("cost model is corrected by 3 plans measured by `texc tune`"), "{e}");
    assert_eq!(corrected, serde_json::json!(["conv2d"]), "{e}");
    // Once the layer has a record of its own, its knobs run on the plan
    // they were measured with: the model's own choice, uncorrected.
    let mut tune_layer = vec!["tune", "benches/conv_layer.tex", "--target", "x86-avx2", "--shape"];
    tune_layer.extend(["C=256,H=14,W=14,K=256", "--trials", "1", "--repeat", "1", "--warmup", "0"]);
    let o = texc(&db, &tune_layer);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o).1);
    let (tuned, e) = plan_of(&[]);
    assert!(e.contains("using tuned knobs") && !e.contains("corrected"), "{e}");
    assert_eq!(tuned, nominal, "{e}");
}

/// A tuner's worker told a limit (`go 0.000001`, in ms) that its first run
/// exceeds is measured by that run alone, and says so (`runs` 1, `warmup`
/// 0); told none, it makes all its runs. (The tuner's limit: 4× its best.)
#[test]
fn a_worker_past_the_tuners_limit_times_one_run() {
    let db = tmp("cut.jsonl");
    let worker = |go: &str| {
        let mut c = texc_cmd(&db, &["bench", "examples/matmul.tex", "--target", "x86-avx2"]);
        c.args(["--json", "--no-db", "--repeat", "5", "--warmup", "2", "--wait-to-time"]);
        let mut child = c.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawns");
        {
            use std::io::Write;
            let mut stdin = child.stdin.take().expect("stdin");
            stdin.write_all(go.as_bytes()).expect("go");
        }
        let o = child.wait_with_output().expect("worker ends");
        let (out, e) = text(&o);
        assert_eq!(o.status.code(), Some(0), "{e}");
        let json = out.lines().find(|l| l.starts_with('{')).expect("the JSON line").to_string();
        let v: serde_json::Value = serde_json::from_str(&json).expect("json");
        (v["runs"].as_u64(), v["warmup"].as_u64())
    };
    assert_eq!(worker("go 0.000001\n"), (Some(1), Some(0)));
    assert_eq!(worker("go\n"), (Some(5), Some(2)));
}
