//! The knobs of the default schedules, as one typed table: each knob's
//! name, target family, the values the autotuner tries, the values `--knob`
//! accepts, what it means and which field of [`DefaultKnobs`] it sets.
//! `--knob`, `texc tune`'s search space and the tuning database's checks
//! all read this table; a knob's name is spelled here only.

use crate::default::DefaultKnobs;

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
pub const KNOBS: [Knob; 17] = [
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
    knob!("unroll", Cpu, &[1, 2, 4], Accepts::Range(1, 16), "the innermost reduction loop unrolled by", |d, v| d
        .unroll
        .replace(v)
        .is_none()),
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
        Accepts::OneOf(&[32, 64]),
        "the largest reduction slice of shared-memory products",
        |d, v| d.gslice.replace(v).is_none()
    ),
    knob!("stages", Gpu, &[3, 2, 4], Accepts::Range(2, 4), "slices of shared-memory products in flight", |d, v| d
        .stages
        .replace(v)
        .is_none()),
];

/// The knob named `name`.
pub fn lookup(name: &str) -> Option<&'static Knob> {
    KNOBS.iter().find(|k| k.name == name)
}

/// The knobs of `family` with the values the autotuner tries.
pub fn space(family: Family) -> Vec<(&'static str, &'static [i64])> {
    KNOBS.iter().filter(|k| k.family == family).map(|k| (k.name, k.candidates)).collect()
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

    #[test]
    fn knobs_outside_the_table_are_refused_by_name() {
        let knobs = |kv: &[(&str, i64)]| kv.iter().map(|(n, v)| (n.to_string(), *v)).collect::<crate::Knobs>();
        assert_eq!(DefaultKnobs::from_knobs(&knobs(&[("rows", 4)])).map(|d| d.rows), Ok(Some(4)));
        assert!(matches!(DefaultKnobs::from_knobs(&knobs(&[("rowz", 4)])), Err(KnobError::Unknown(n)) if n == "rowz"));
        let e = DefaultKnobs::from_knobs(&knobs(&[("vec", 300)])).expect_err("range");
        assert_eq!(e.to_string(), "knob `vec` = 300 is out of its range: `vec` takes 128, 256, 512");
    }
}
