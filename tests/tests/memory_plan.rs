//! The memory plan (`texc_schedules::memory_plan`): temporaries whose
//! lifetimes meet never share bytes, every one lies in the arena at a
//! 64-byte boundary, and the plan reuses memory where lifetimes are apart.
//! That compiled code computes the same with temporaries in the arena is
//! what every conformance test checks (`backends.rs`, `conformance.rs`).

use texc_compiler::Bindings;
use texc_runtime::SplitMix64;
use texc_schedules::memory_plan::{plan, MemoryPlan, ALIGN};
use texc_schedules::LoopFunc;
use texc_tests::*;

fn check(name: &str, f: &LoopFunc) -> MemoryPlan {
    let m = plan(f);
    assert_eq!(m.slots.len(), f.live_temps().len(), "{name}: a slot per temporary");
    for (i, a) in m.slots.iter().enumerate() {
        assert_eq!(a.offset % ALIGN, 0, "{name}: aligned");
        assert!(a.bytes >= texc_schedules::memory_plan::temp_bytes(&f.p, a.tensor), "{name}: room");
        assert!(a.offset + a.bytes <= m.arena_bytes, "{name}: inside the arena");
        assert!(a.first <= a.last && a.last < f.body.len().max(1), "{name}: a lifetime within the body");
        for b in &m.slots[i + 1..] {
            let meet = a.first <= b.last && b.first <= a.last;
            let overlap = a.offset < b.offset + b.bytes && b.offset < a.offset + a.bytes;
            assert!(!(meet && overlap), "{name}: {:?} and {:?} share bytes while both are live", a, b);
        }
    }
    assert!(m.arena_bytes <= m.sum_bytes, "{name}: never more than a buffer each");
    m
}

#[test]
fn plans_of_examples_and_random_schedules_keep_live_temporaries_apart() {
    let programs = example_programs(1e8);
    assert!(programs.len() > 10, "{} examples", programs.len());
    for (name, p) in programs {
        let mut pl = pipeline("x86-avx2");
        let f = pl.default_loops(p.clone()).unwrap_or_else(|e| panic!("{}", rendered(&pl, e))).legal;
        check(&name, &f);
        let mut rng = SplitMix64::new(name.len() as u64);
        for i in 0..4 {
            check(&format!("{name} (random schedule {i})"), &randomly_scheduled(&p, &mut rng));
        }
    }
}

/// A chain of element-wise stages that cannot be inlined into each other
/// (each reads its producer at two places), materialized one after another:
/// each temporary is dead two statements later, so two slots serve all seven temporaries.
#[test]
fn a_chain_reuses_the_memory_of_finished_stages() {
    let mut src = String::from("kernel chain(X: f32[N = 4096]) -> Y: f32[N] {\n    t0[i] = X[i] * 2.0;\n");
    for k in 1..8 {
        src.push_str(&format!("    t{k}[i] = t{}[i] * t{}[(i + 1) % N];\n", k - 1, k - 1));
    }
    src.push_str("    Y[i] = t7[i] + 1.0;\n}\n");
    let (mut pl, k) = load_text("x86-avx2", "chain.tex", &src, None).expect("compiles");
    let p = specialize(&mut pl, k, &Bindings::default());
    let f = pl.default_loops(p).unwrap_or_else(|e| panic!("{}", rendered(&pl, e))).legal;
    let m = check("chain", &f);
    // t0 (cheap) is inlined into t1; t1 to t7 are materialized.
    assert_eq!(m.slots.len(), 7);
    assert_eq!(m.sum_bytes, 7 * 4096 * 4);
    assert_eq!(m.arena_bytes, 2 * 4096 * 4, "each stage needs its input and output only");
}
