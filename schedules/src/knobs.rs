//! The knobs of the default schedules, as one typed table: each knob's
//! name, target family, the values the autotuner tries, the values `--knob`
//! accepts, what it means and which field of [`DefaultKnobs`] it sets.
//! `--knob`, `texc tune`'s search space and the tuning database's checks
//! all read this table; a knob's name is spelled here only. Each
//! family's knobs are listed together: a strategy hands its rows out as one
//! slice ([`of`]).

/// Parameters of the default schedule that `--knob` (and the autotuner)
/// may set for a kernel without a schedule block of its own — together the
/// space `texc tune` searches for it, generated from the kernel's structure
/// rather than a template:
/// - register blocking: `rows` (rows of a register block, taken as given:
///   a last, shorter block is a copy of the loops), `nvec` (vectors across a
///   BLIS-style micro-kernel, which is also the width of its packed panels);
/// - multi-level tiling: `kslice` (depth of the reduction slices of long
///   products), `cols` (columns of a block of packed panels);
/// - `pack` (0: no packing of the vector operand);
/// - `order` (1: a long product's column panels outside its row blocks,
///   so a packed panel stays in L1 across the rows instead of a block of
///   rows across the panels);
/// - `unroll` (the innermost reduction loop of a register block unrolled by
///   that many iterations);
/// - `par` (0: no loop runs on the thread pool), `vec` (vector width in
///   bits, at most the target's: 256 on an AVX-512 target);
/// - `attach` (0: every stage in a loop nest of its own, instead of
///   temporaries computed inside the loop of the stage that reads them);
/// - `follow` (0: a stage's threads share out its own outer loops, not
///   the axis its producer's threads shared out: the CPU strategy's
///   `threads`);
/// - `racc` (vectors of partial results of a float row reduction: its
///   independent combining chains);
/// - `recip` (1: every float division by a value that stays the same along
///   the row, `/ sqrt(v[n] + eps)` too, is a multiplication by a reciprocal
///   computed once per row; 0: none is; by default only divisions by a
///   loaded value, a softmax's `/ s[n]`);
/// - `acc` (0: a register block accumulates into its output in memory,
///   initialised by a nest of its own, and its epilogue is a pass of its
///   own, instead of accumulators in registers written once through the
///   epilogue: `local_accumulators` and `fold_epilogues` of the CPU strategy);
/// - `flash` (0: an attention's five statements scheduled one by one,
///   scores held whole, instead of one flash-style nest: `crate::flash`)
///   with `fkeys` and `fqueries` (keys and queries per block of that nest);
/// - on GPUs, `gather` (0: a convolution's
///   columns are written out, an explicit im2col, instead of gathered from
///   the image into shared memory), and for tensor-core products through
///   shared memory `gtile` (the largest block tile side tried: 128 or 64;
///   the 64×64 warp tiles stay), `gslice` (the largest slice of the
///   reduction tried: 64 or 32; 128 for 8-bit products, their default)
///   and `stages` (slices in flight, 2 to 4);
///   `wgmma` (0: on sm_90, such products on `mma.sync` warps instead of
///   Hopper's warpgroup operations).
///
/// Unset, each keeps its machine-derived value. [`KNOBS`] is the table of
/// them: names, the values `--knob` accepts and `tune` tries.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct DefaultKnobs {
    pub rows: Option<i64>,
    pub kslice: Option<i64>,
    pub cols: Option<i64>,
    pub pack: Option<bool>,
    pub par: Option<bool>,
    pub vec: Option<i64>,
    pub nvec: Option<i64>,
    pub order: Option<bool>,
    pub unroll: Option<i64>,
    pub attach: Option<bool>,
    pub follow: Option<bool>,
    pub racc: Option<i64>,
    pub recip: Option<bool>,
    pub acc: Option<bool>,
    pub flash: Option<bool>,
    pub fkeys: Option<i64>,
    pub fqueries: Option<i64>,
    pub gather: Option<bool>,
    pub gtile: Option<i64>,
    pub gslice: Option<i64>,
    pub stages: Option<i64>,
    pub wgmma: Option<bool>,
}

/// The target family whose default schedule a knob steers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    Cpu,
    Gpu,
}

/// The values a knob accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Accepts {
    /// `lo..=hi`.
    Range(i64, i64),
    /// One of these.
    OneOf(&'static [i64]),
    /// 0 or 1.
    Flag,
}

impl Accepts {
    pub fn contains(self, v: i64) -> bool {
        match self {
            Accepts::Range(lo, hi) => (lo..=hi).contains(&v),
            Accepts::OneOf(vs) => vs.contains(&v),
            Accepts::Flag => v == 0 || v == 1,
        }
    }

    pub fn describe(self) -> String {
        match self {
            Accepts::Range(lo, hi) => format!("{lo}..={hi}"),
            Accepts::OneOf(vs) => vs.iter().map(|v| v.to_string()).collect::<Vec<_>>().join(", "),
            Accepts::Flag => "0 or 1".into(),
        }
    }
}

/// One knob of a default schedule.
#[derive(Clone, Copy)]
pub struct Knob {
    pub name: &'static str,
    pub family: Family,
    /// The values the autotuner tries, the most promising first.
    pub candidates: &'static [i64],
    pub accepts: Accepts,
    /// What it steers (`texc tune --help` and the docs say more).
    pub doc: &'static str,
    set: fn(&mut DefaultKnobs, i64) -> bool,
}

macro_rules! knob {
    ($name:literal, $family:ident, $candidates:expr, $accepts:expr, $doc:literal, |$d:ident, $v:ident| $set:expr) => {
        Knob {
            name: $name,
            family: Family::$family,
            candidates: $candidates,
            accepts: $accepts,
            doc: $doc,
            set: |$d, $v| $set,
        }
    };
}

/// Every knob, CPU ones first, in the order the autotuner searches them.
pub const KNOBS: [Knob; 22] = [
    knob!("rows", Cpu, &[2, 3, 4, 5, 6, 8, 12], Accepts::Range(1, 64), "rows of a register block", |d, v| d
        .rows
        .replace(v)
        .is_none()),
    knob!("nvec", Cpu, &[2, 1, 3], Accepts::Range(1, 4), "vectors across a register block", |d, v| d
        .nvec
        .replace(v)
        .is_none()),
    knob!(
        "kslice",
        Cpu,
        &[64, 128, 256, 512, 1024],
        Accepts::Range(1, 1 << 20),
        "depth of a long product's reduction slices",
        |d, v| d.kslice.replace(v).is_none()
    ),
    knob!(
        "cols",
        Cpu,
        &[64, 128, 256, 512, 1024],
        Accepts::Range(1, 1 << 20),
        "columns of a block of packed panels",
        |d, v| d.cols.replace(v).is_none()
    ),
    knob!("pack", Cpu, &[1, 0], Accepts::Flag, "0: the vector operand is not packed", |d, v| d
        .pack
        .replace(v == 1)
        .is_none()),
    knob!("order", Cpu, &[0, 1], Accepts::Flag, "1: column panels outside row blocks", |d, v| d
        .order
        .replace(v == 1)
        .is_none()),
    knob!(
        "unroll",
        Cpu,
        &[1, 2, 4],
        Accepts::Range(1, 16),
        "the innermost serial reduction loop unrolled by",
        |d, v| d.unroll.replace(v).is_none()
    ),
    knob!("par", Cpu, &[1, 0], Accepts::Flag, "0: no loop runs on the thread pool", |d, v| d
        .par
        .replace(v == 1)
        .is_none()),
    knob!("vec", Cpu, &[512, 256], Accepts::OneOf(&[128, 256, 512]), "vector width in bits", |d, v| d
        .vec
        .replace(v)
        .is_none()),
    knob!("attach", Cpu, &[1, 0], Accepts::Flag, "0: every stage a nest of its own", |d, v| d
        .attach
        .replace(v == 1)
        .is_none()),
    knob!("follow", Cpu, &[1, 0], Accepts::Flag, "0: threads share out a stage's own outer loops", |d, v| d
        .follow
        .replace(v == 1)
        .is_none()),
    knob!("racc", Cpu, &[4, 2, 1], Accepts::Range(1, 8), "partial results of a float row reduction", |d, v| d
        .racc
        .replace(v)
        .is_none()),
    knob!("recip", Cpu, &[0, 1], Accepts::Flag, "1: divisions constant along rows by reciprocals; 0: none", |d, v| d
        .recip
        .replace(v == 1)
        .is_none()),
    knob!("acc", Cpu, &[1, 0], Accepts::Flag, "0: register blocks accumulate in memory", |d, v| d
        .acc
        .replace(v == 1)
        .is_none()),
    knob!(
        "flash",
        Cpu,
        &[1, 0],
        Accepts::Flag,
        "0: an attention's statements one by one, scores held whole",
        |d, v| d.flash.replace(v == 1).is_none()
    ),
    knob!(
        "fkeys",
        Cpu,
        &[64, 32, 128],
        Accepts::OneOf(&[16, 32, 64, 128, 256]),
        "keys per block of a flash attention",
        |d, v| d.fkeys.replace(v).is_none()
    ),
    knob!(
        "fqueries",
        Cpu,
        &[16, 8, 4],
        Accepts::OneOf(&[1, 2, 4, 8, 16, 32]),
        "queries per block of a flash attention",
        |d, v| d.fqueries.replace(v).is_none()
    ),
    knob!("gather", Gpu, &[1, 0], Accepts::Flag, "0: a convolution's columns written out (explicit im2col)", |d, v| d
        .gather
        .replace(v == 1)
        .is_none()),
    knob!(
        "gtile",
        Gpu,
        &[128, 64],
        Accepts::OneOf(&[64, 128]),
        "the largest block tile side of shared-memory products",
        |d, v| d.gtile.replace(v).is_none()
    ),
    knob!(
        "gslice",
        Gpu,
        &[64, 32],
        Accepts::OneOf(&[32, 64, 128]),
        "the largest reduction slice of shared-memory products (8-bit ones take 128 unless capped)",
        |d, v| d.gslice.replace(v).is_none()
    ),
    knob!("stages", Gpu, &[3, 2, 4], Accepts::Range(2, 4), "slices of shared-memory products in flight", |d, v| d
        .stages
        .replace(v)
        .is_none()),
    knob!("wgmma", Gpu, &[1, 0], Accepts::Flag, "0: sm_90 products on mma.sync, not warpgroup wgmma", |d, v| d
        .wgmma
        .replace(v == 1)
        .is_none()),
];

/// The knob named `name`.
pub fn lookup(name: &str) -> Option<&'static Knob> {
    KNOBS.iter().find(|k| k.name == name)
}

/// The knobs of `family` (a strategy's rows of [`KNOBS`], which lists each
/// family's together).
pub fn of(family: Family) -> &'static [Knob] {
    const ALL: &[Knob] = &KNOBS;
    let start = ALL.iter().position(|k| k.family == family).unwrap_or(ALL.len());
    let len = ALL[start..].iter().take_while(|k| k.family == family).count();
    &ALL[start..start + len]
}

/// The knobs of `family` with the values the autotuner tries.
pub fn space(family: Family) -> Vec<(&'static str, &'static [i64])> {
    KNOBS.iter().filter(|k| k.family == family).map(|k| (k.name, k.candidates)).collect()
}

/// [`space`] on `target`: without the knobs that change nothing there
/// (`wgmma` below sm_90), so that tuning tries no candidate twice.
pub fn space_on(family: Family, target: &texc_compiler::target::Target) -> Vec<(&'static str, &'static [i64])> {
    let hopper = target.gpu.is_some_and(|g| g.sm >= 90);
    space(family).into_iter().filter(|&(name, _)| name != "wgmma" || hopper).collect()
}

/// Why `--knob name=v` is refused: an unknown name (listing the knobs
/// there are), a value outside what it accepts, or the knob given twice.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum KnobError {
    #[error("knob `{0}` is not a knob of the default schedule (its knobs: {cpu}; on GPUs: {gpu}; the pipeline's: rewrite, winograd, im2col)", cpu = names(Family::Cpu), gpu = names(Family::Gpu))]
    Unknown(String),
    #[error("knob `{name}` = {value} is out of its range: `{name}` takes {accepts}")]
    Range { name: &'static str, value: i64, accepts: String },
    #[error("knob `{0}` is set twice")]
    Twice(&'static str),
}

fn names(family: Family) -> String {
    KNOBS.iter().filter(|k| k.family == family).map(|k| k.name).collect::<Vec<_>>().join(", ")
}

impl DefaultKnobs {
    /// From `--knob` values, checked against [`KNOBS`].
    pub fn from_knobs(knobs: &crate::Knobs) -> Result<DefaultKnobs, KnobError> {
        let mut d = DefaultKnobs::default();
        for (name, &v) in knobs {
            let k = lookup(name).ok_or_else(|| KnobError::Unknown(name.clone()))?;
            if !k.accepts.contains(v) {
                return Err(KnobError::Range { name: k.name, value: v, accepts: k.accepts.describe() });
            }
            if !(k.set)(&mut d, v) {
                return Err(KnobError::Twice(k.name));
            }
        }
        Ok(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every knob sets a field of its own, and its candidates are values it accepts.
    #[test]
    fn each_knob_sets_its_own_field_within_what_it_accepts() {
        for k in &KNOBS {
            assert!(k.candidates.iter().all(|&v| k.accepts.contains(v)), "{}", k.name);
            let mut d = DefaultKnobs::default();
            assert!((k.set)(&mut d, k.candidates[0]));
            assert_ne!(d, DefaultKnobs::default(), "{} sets a field", k.name);
            let others: Vec<&Knob> = KNOBS.iter().filter(|o| o.name != k.name).collect();
            for o in others {
                let mut e = d;
                assert!((o.set)(&mut e, o.candidates[0]), "{} and {} set different fields", k.name, o.name);
            }
        }
        let names: Vec<&str> = KNOBS.iter().map(|k| k.name).collect();
        let mut unique = names.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), names.len());
    }

    /// [`of`] hands out a slice: each family's knobs must be listed together.
    #[test]
    fn each_familys_knobs_are_listed_together() {
        for family in [Family::Cpu, Family::Gpu] {
            let listed: Vec<&str> = of(family).iter().map(|k| k.name).collect();
            let all: Vec<&str> = KNOBS.iter().filter(|k| k.family == family).map(|k| k.name).collect();
            assert_eq!(listed, all);
        }
    }

    #[test]
    fn knobs_outside_the_table_are_refused_by_name() {
        let knobs = |kv: &[(&str, i64)]| kv.iter().map(|(n, v)| (n.to_string(), *v)).collect::<crate::Knobs>();
        assert_eq!(DefaultKnobs::from_knobs(&knobs(&[("rows", 4)])).map(|d| d.rows), Ok(Some(4)));
        assert!(matches!(DefaultKnobs::from_knobs(&knobs(&[("rowz", 4)])), Err(KnobError::Unknown(n)) if n == "rowz"));
        let e = DefaultKnobs::from_knobs(&knobs(&[("vec", 300)])).expect_err("range");
        assert_eq!(e.to_string(), "knob `vec` = 300 is out of its range: `vec` takes 128, 256, 512");
    }
}
