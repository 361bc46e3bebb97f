//! The tuner's learned cost model: gradient-boosted regression trees
//! (smartcore's XGBoost regressor, the model family of TVM's AutoTVM and
//! Ansor) trained online on the trials measured so far, mapping features
//! of a candidate's loop nest to its log time. The search asks it to rank
//! candidates before any is compiled, and measures the one it predicts
//! fastest.
//!
//! [`features`] reads a loop nest (after legalization) as a fixed-length
//! vector: how much of the work is vector code and how wide, how much is
//! unrolled, what runs in parallel, what stays in local buffers, how the
//! vector loops access memory ([`crate::analysis::access`]), followed by the
//! candidate's knob values. Counts are log-scaled, so that the trees split
//! on orders of magnitude. Invariant: every vector has [`N_LOOP_FEATURES`]
//! entries plus one per knob name given, in that order.

use crate::analysis::{self, Access};
use crate::ir::{ForKind, LoopFunc, Stmt};
use smartcore::linalg::basic::matrix::DenseMatrix;
use smartcore::xgboost::{XGRegressor, XGRegressorParameters};
use texc_compiler::tir::{TExpr, TExprId, VarId};

/// Loop-nest features before the knob values.
pub const N_LOOP_FEATURES: usize = 12;

/// Trials measured before the model is trusted to rank candidates.
pub const MIN_SAMPLES: usize = 6;

#[derive(Default)]
struct Walk {
    scalar_stores: f64,
    vector_stores: f64,
    max_lanes: f64,
    unrolled_copies: f64,
    parallel_trips: f64,
    local_bytes: f64,
    loops: f64,
    max_depth: f64,
    contiguous: f64,
    strided: f64,
    gathers: f64,
    innermost_trips: f64,
}

fn lg(x: f64) -> f64 {
    (1.0 + x.max(0.0)).log2()
}

/// The loop nest's walk: `trips` iterations reach `body`, inside a vector
/// loop over `vector` (its lanes), `unrolled` copies deep.
fn walk(
    f: &LoopFunc,
    body: &[Stmt],
    trips: f64,
    vector: Option<(VarId, f64)>,
    unrolled: f64,
    depth: f64,
    w: &mut Walk,
) {
    for s in body {
        match s {
            Stmt::For { var, extent, kind, body, .. } => {
                let n = *extent as f64;
                w.loops += 1.0;
                w.max_depth = w.max_depth.max(depth + 1.0);
                let inner = if body.iter().any(|b| matches!(b, Stmt::For { .. })) { 0.0 } else { n };
                w.innermost_trips = w.innermost_trips.max(inner);
                match kind {
                    ForKind::Vectorized | ForKind::Async => {
                        w.max_lanes = w.max_lanes.max(n);
                        walk(f, body, trips, Some((*var, n)), unrolled, depth + 1.0, w);
                    }
                    ForKind::Unrolled => {
                        w.unrolled_copies = w.unrolled_copies.max(unrolled * n);
                        walk(f, body, trips * n, vector, unrolled * n, depth + 1.0, w);
                    }
                    ForKind::Parallel | ForKind::Block(_) => {
                        w.parallel_trips = w.parallel_trips.max(n);
                        walk(f, body, trips * n, vector, unrolled, depth + 1.0, w);
                    }
                    ForKind::Serial | ForKind::Thread(_) => walk(f, body, trips * n, vector, unrolled, depth + 1.0, w),
                }
            }
            Stmt::If { then, .. } => walk(f, then, trips, vector, unrolled, depth, w),
            Stmt::Alloc { tensor, body } => {
                let d = f.p.tensor(*tensor);
                w.local_bytes += d.len() as f64 * d.elem.size() as f64;
                walk(f, body, trips, vector, unrolled, depth, w);
            }
            Stmt::Store { tensor, indices, value } => match vector {
                None => w.scalar_stores += trips,
                Some((var, _)) => {
                    w.vector_stores += trips;
                    let mut ls = Vec::new();
                    analysis::loads_in(&f.p, *value, &mut ls);
                    let mut accesses: Vec<(texc_compiler::tir::TensorId, Vec<TExprId>)> = ls
                        .iter()
                        .filter_map(|&l| match f.p.expr(l) {
                            TExpr::Load(t, idx) => Some((*t, idx.clone())),
                            _ => None,
                        })
                        .collect();
                    accesses.push((*tensor, indices.clone()));
                    for (t, idx) in accesses {
                        match analysis::access(f, t, &idx, var) {
                            Access::Uniform => {}
                            Access::Contiguous => w.contiguous += trips,
                            Access::Strided(_) => w.strided += trips,
                            Access::Gather => w.gathers += trips,
                        }
                    }
                }
            },
            Stmt::Mma { .. } | Stmt::Wgmma(_) | Stmt::TileDot(_) => w.vector_stores += trips,
            Stmt::Barrier | Stmt::Async(_) | Stmt::WarpReduce(_) | Stmt::Prefetch { .. } => {}
        }
    }
}

/// The features of loop nest `f` built with `knobs`, knob values in the
/// order of `names` (0 for a knob not given: the template's own choice).
pub fn features(f: &LoopFunc, knobs: &[(String, i64)], names: &[String]) -> Vec<f64> {
    let mut w = Walk { unrolled_copies: 1.0, ..Walk::default() };
    walk(f, &f.body, 1.0, None, 1.0, 0.0, &mut w);
    let mut v = vec![
        lg(w.scalar_stores),
        lg(w.vector_stores),
        w.max_lanes,
        lg(w.unrolled_copies),
        lg(w.parallel_trips),
        lg(w.local_bytes),
        w.loops,
        w.max_depth,
        lg(w.contiguous),
        lg(w.strided),
        lg(w.gathers),
        lg(w.innermost_trips),
    ];
    debug_assert_eq!(v.len(), N_LOOP_FEATURES);
    for n in names {
        // A knob left to the template is -1, apart from every value (`lg` ≥ 0).
        v.push(knobs.iter().find(|(k, _)| k == n).map_or(-1.0, |&(_, x)| lg(x.unsigned_abs() as f64)));
    }
    v
}

type Model = XGRegressor<f64, f64, DenseMatrix<f64>, Vec<f64>>;

/// Measured trials and the model fitted to them.
#[derive(Default)]
pub struct CostModel {
    rows: Vec<Vec<f64>>,
    log_ms: Vec<f64>,
    fitted: Option<Model>,
}

impl CostModel {
    pub fn new() -> CostModel {
        CostModel::default()
    }

    /// A measured trial: its features and median time in ms.
    pub fn observe(&mut self, features: Vec<f64>, ms: f64) {
        if ms.is_finite() && ms > 0.0 && self.rows.first().is_none_or(|r| r.len() == features.len()) {
            self.rows.push(features);
            self.log_ms.push(ms.ln());
        }
    }

    pub fn samples(&self) -> usize {
        self.rows.len()
    }

    /// Refit on every trial observed; false (and no model) below [`MIN_SAMPLES`].
    pub fn fit(&mut self) -> bool {
        self.fitted = None;
        if self.rows.len() < MIN_SAMPLES {
            return false;
        }
        let Ok(x) = DenseMatrix::from_2d_vec(&self.rows) else { return false };
        // Targets relative to their mean: the trees start from 0, not from an absolute time.
        let mean = self.log_ms.iter().sum::<f64>() / self.log_ms.len() as f64;
        let y: Vec<f64> = self.log_ms.iter().map(|t| t - mean).collect();
        let params = XGRegressorParameters::default()
            .with_n_estimators(60)
            .with_max_depth(3)
            .with_learning_rate(0.3)
            .with_min_child_weight(1)
            .with_seed(7);
        self.fitted = Model::fit(&x, &y, params).ok();
        self.fitted.is_some()
    }

    /// Predicted log time (relative: only the order of candidates means
    /// anything), or `None` without a fitted model.
    pub fn predict(&self, features: &[Vec<f64>]) -> Option<Vec<f64>> {
        let m = self.fitted.as_ref()?;
        if features.is_empty() {
            return Some(Vec::new());
        }
        let x = DenseMatrix::from_2d_vec(&features.to_vec()).ok()?;
        m.predict(&x).ok()
    }
}

/// Spearman's rank correlation of two equally long series (ties ranked by
/// position); 0 for fewer than two points.
pub fn spearman(a: &[f64], b: &[f64]) -> f64 {
    let n = a.len().min(b.len());
    if n < 2 {
        return 0.0;
    }
    let ranks = |x: &[f64]| {
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by(|&i, &j| x[i].total_cmp(&x[j]));
        let mut r = vec![0.0; n];
        for (rank, &i) in order.iter().enumerate() {
            r[i] = rank as f64;
        }
        r
    };
    let (ra, rb) = (ranks(a), ranks(b));
    let d2: f64 = ra.iter().zip(&rb).map(|(x, y)| (x - y) * (x - y)).sum();
    let n = n as f64;
    1.0 - 6.0 * d2 / (n * (n * n - 1.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A synthetic space where time falls with one feature and rises with
    /// another: the fitted model ranks unseen candidates in the true order.
    #[test]
    fn the_model_ranks_unseen_candidates() {
        let truth = |x: &[f64]| (3.0 - 0.5 * x[0] + 0.25 * x[1] * x[1] - 0.1 * x[2]).exp();
        let mut m = CostModel::new();
        assert!(!m.fit(), "no model before MIN_SAMPLES trials");
        assert!(m.predict(&[vec![0.0; 3]]).is_none());
        let grid: Vec<Vec<f64>> =
            (0..6).flat_map(|a| (0..4).map(move |b| vec![a as f64, b as f64, ((a * b) % 3) as f64])).collect();
        for x in grid.iter().step_by(2) {
            m.observe(x.clone(), truth(x));
        }
        assert!(m.fit());
        let unseen: Vec<Vec<f64>> = grid.iter().skip(1).step_by(2).cloned().collect();
        let predicted = m.predict(&unseen).expect("fitted");
        let actual: Vec<f64> = unseen.iter().map(|x| truth(x).ln()).collect();
        let rho = spearman(&predicted, &actual);
        assert!(rho > 0.8, "rank correlation {rho} on unseen candidates");
    }

    #[test]
    fn spearman_of_orders() {
        assert_eq!(spearman(&[1.0, 2.0, 3.0], &[10.0, 20.0, 30.0]), 1.0);
        assert_eq!(spearman(&[1.0, 2.0, 3.0], &[3.0, 2.0, 1.0]), -1.0);
        assert_eq!(spearman(&[1.0], &[1.0]), 0.0);
    }

    /// Features see vector width, unrolling and parallelism, and the knobs in the order named.
    #[test]
    fn features_read_the_loop_nest() {
        let src = "func k [N=64]\n  input X: f32[64, 64]\n  output Y: f32[64, 64]\n  for i in 0..64 parallel:\n    for r in 0..4 unrolled:\n      for v in 0..16 vectorized:\n        Y[i, r * 16 + v] = X[i, r * 16 + v] * 2.0f32\n";
        let mut sm = texc_grammar::span::SourceMap::new();
        let id = sm.add("k.loops", src);
        let f = crate::text::parse(src, id).expect("parses").func;
        let names = vec!["b".to_string(), "a".to_string()];
        let v = features(&f, &[("a".into(), 8), ("b".into(), 1)], &names);
        assert_eq!(v.len(), N_LOOP_FEATURES + 2);
        assert_eq!(v[0], 0.0, "no scalar stores");
        assert_eq!(v[1], lg(64.0 * 4.0), "vector stores");
        assert_eq!(v[2], 16.0, "lanes");
        assert_eq!(v[3], lg(4.0), "unrolled copies");
        assert_eq!(v[4], lg(64.0), "parallel trips");
        assert_eq!(v[8], lg(2.0 * 64.0 * 4.0), "contiguous load and store");
        assert_eq!((v[N_LOOP_FEATURES], v[N_LOOP_FEATURES + 1]), (lg(1.0), lg(8.0)));
    }
}
