//! `LSTM` and `GRU` with ONNX's semantics: forward, reverse and
//! bidirectional, optional biases, initial states and (LSTM) peepholes,
//! every output (`Y`, `Y_h`, `Y_c`).
//!
//! Shapes are concrete, so the recurrence is unrolled at import: one
//! statement computes the input projection of every time step at once, then
//! each step is a few statements that read the previous step's state. The
//! outputs gather the steps' states with a select on the time index.
//!
//! Invariants: only what the operator computes exactly is translated: the
//! default activations (sigmoid, tanh, tanh), no `clip`, no `input_forget`,
//! `layout` 0 (ONNX Runtime, the reference, runs no other), and
//! `sequence_lens` only when every sequence is the full length; anything
//! else is refused naming the attribute or input.

use crate::attrs::Attrs;
use crate::proto::NodeProto;
use crate::{Importer, ValueId};

type R<T = ()> = Result<T, String>;

/// The longest sequence unrolled (statements grow with it).
const MAX_STEPS: usize = 1024;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Cell {
    Lstm,
    Gru,
}

/// The state before a step: zeros, an initial-state input, or a step's result.
#[derive(Clone)]
enum Prev {
    Zero,
    /// `initial_h[d, b, j]`
    Init(String, usize),
    Step(String),
}

impl Prev {
    fn at(&self, b: &str, j: &str) -> String {
        match self {
            Prev::Zero => "0.0".into(),
            Prev::Init(t, d) => format!("{t}[{d}, {b}, {j}]"),
            Prev::Step(t) => format!("{t}[{b}, {j}]"),
        }
    }
}

impl Importer<'_> {
    pub(crate) fn lstm(&mut self, n: &NodeProto) -> R {
        self.recurrent(n, Cell::Lstm)
    }

    pub(crate) fn gru(&mut self, n: &NodeProto) -> R {
        self.recurrent(n, Cell::Gru)
    }

    fn recurrent(&mut self, n: &NodeProto, cell: Cell) -> R {
        let lstm = cell == Cell::Lstm;
        let mut known =
            vec!["activation_alpha", "activation_beta", "activations", "clip", "direction", "hidden_size", "layout"];
        known.push(if lstm { "input_forget" } else { "linear_before_reset" });
        let a = Attrs::new(n, &known)?;
        let defaults: &[&str] = if lstm { &["Sigmoid", "Tanh", "Tanh"] } else { &["Sigmoid", "Tanh"] };
        if let Some(acts) = a.strings("activations")? {
            let per_dir: Vec<&[String]> = acts.chunks(defaults.len()).collect();
            let default = per_dir.iter().all(|c| c.iter().map(String::as_str).eq(defaults.iter().copied()));
            if !default || acts.len() % defaults.len() != 0 {
                return Err(format!("activations {acts:?}: only the defaults {defaults:?} are supported"));
            }
        }
        if a.has("activation_alpha") || a.has("activation_beta") || a.has("clip") {
            return Err("activation_alpha, activation_beta and clip are not supported".into());
        }
        if lstm && a.int("input_forget", 0)? != 0 {
            return Err("input_forget = 1 is not supported".into());
        }
        let before_reset = !lstm && a.int("linear_before_reset", 0)? != 0;
        let dirs: Vec<bool> = match a.string("direction", "forward")?.as_str() {
            "forward" => vec![false],
            "reverse" => vec![true],
            "bidirectional" => vec![false, true],
            other => return Err(format!("direction = \"{other}\"")),
        };
        if a.int("layout", 0)? != 0 {
            return Err(format!("layout = {}: only 0 ([seq, batch, …]) is supported", a.int("layout", 0)?));
        }
        let ins = self.inputs(n, 3, if lstm { 8 } else { 6 })?;
        let (x, w, r) = (Self::required(&ins, 0)?, Self::required(&ins, 1)?, Self::required(&ins, 2)?);
        let opt = |i: usize| ins.get(i).copied().flatten();
        let (bias, lens, init_h) = (opt(3), opt(4), opt(5));
        let (init_c, peep) = if lstm { (opt(6), opt(7)) } else { (None, None) };
        let xs = self.shape(x).to_vec();
        if xs.len() != 3 {
            return Err(format!("X of shape {xs:?}: expected rank 3"));
        }
        let (steps, b, inp) = (xs[0], xs[1], xs[2]);
        let gates = if lstm { 4 } else { 3 };
        let ws = self.shape(w).to_vec();
        let nd = dirs.len();
        let h = ws.get(1).map_or(0, |&g| g / gates);
        if ws != [nd, gates * h, inp] || h == 0 {
            return Err(format!("W of shape {ws:?}: expected [{nd}, {gates}·hidden_size, {inp}]"));
        }
        if a.has("hidden_size") && a.int("hidden_size", 0)? != h as i64 {
            return Err(format!("hidden_size {} differs from W's {h}", a.int("hidden_size", 0)?));
        }
        let expect = |this: &Self, id: Option<ValueId>, shape: &[usize], what: &str| -> R {
            match id {
                Some(id) if this.shape(id) != shape => {
                    Err(format!("{what} of shape {:?}: expected {shape:?}", this.shape(id)))
                }
                _ => Ok(()),
            }
        };
        expect(self, Some(r), &[nd, gates * h, h], "R")?;
        expect(self, bias, &[nd, 2 * gates * h], "B")?;
        expect(self, init_h, &[nd, b, h], "initial_h")?;
        expect(self, init_c, &[nd, b, h], "initial_c")?;
        expect(self, peep, &[nd, 3 * h], "P")?;
        if let Some(l) = lens {
            let v = self.int_constant(l, "sequence_lens")?;
            if self.shape(l) != [b] || v.iter().any(|&s| s != steps as i64) {
                return Err(format!("sequence_lens {v:?}: only full-length sequences ({steps}) are supported"));
            }
        }
        if steps > MAX_STEPS {
            return Err(format!("{steps} time steps: up to {MAX_STEPS} are unrolled"));
        }
        let prefix = n.output.iter().find(|o| !o.is_empty()).ok_or("has no output")?.clone();
        let xt = self.tensor(x)?;
        let (wt, rt) = (self.tensor(w)?, self.tensor(r)?);
        let bt = bias.map(|id| self.tensor(id)).transpose()?;
        let ht0 = init_h.map(|id| self.tensor(id)).transpose()?;
        let ct0 = init_c.map(|id| self.tensor(id)).transpose()?;
        let pt = peep.map(|id| self.tensor(id)).transpose()?;
        // Per direction, each step's hidden (and cell) state, in time order.
        let mut hs: Vec<Vec<String>> = Vec::new();
        let mut cs: Vec<Vec<String>> = Vec::new();
        for (d, &reverse) in dirs.iter().enumerate() {
            // The input projection of every step: gx[t, b, g] = X[t, b]·W[d, g] + Wb[d, g].
            let mut rhs = format!("sum[r0 in 0..{inp}]({xt}[i0, i1, r0] * {wt}[{d}, i2, r0])");
            if let Some(bt) = &bt {
                rhs = format!("{rhs} + {bt}[{d}, i2]");
            }
            let gx = self.def(&format!("{prefix}#gx{d}"), vec![steps, b, gates * h], rhs)?;
            let mut hp = ht0.as_ref().map_or(Prev::Zero, |t| Prev::Init(t.clone(), d));
            let mut cp = ct0.as_ref().map_or(Prev::Zero, |t| Prev::Init(t.clone(), d));
            let (mut hd, mut cd) = (vec![String::new(); steps], vec![String::new(); steps]);
            for s in 0..steps {
                let t = if reverse { steps - 1 - s } else { s };
                let name = |what: &str| format!("{prefix}#{what}{d}_{t}");
                // The recurrent projection of gate rows `off + i1`: H·R[d, g] + Rb[d, g].
                let rec = |hp: &Prev, off: usize| -> Option<String> {
                    let sum = (!matches!(hp, Prev::Zero))
                        .then(|| format!("sum[r0 in 0..{h}]({} * {rt}[{d}, {off} + i1, r0])", hp.at("i0", "r0")));
                    let rb = bt.as_ref().map(|bt| format!("{bt}[{d}, {} + i1]", gates * h + off));
                    match (sum, rb) {
                        (None, None) => None,
                        (Some(x), None) | (None, Some(x)) => Some(x),
                        (Some(x), Some(y)) => Some(format!("{x} + {y}")),
                    }
                };
                let gxa = |off: usize| format!("{gx}[{t}, i0, {off} + i1]");
                if lstm {
                    // All four gates' pre-activations of this step (the input projection alone at a first step
                    // from zeros without biases).
                    let ga: Box<dyn Fn(usize) -> String> = match rec(&hp, 0) {
                        None => Box::new(gxa),
                        Some(e) => {
                            let g = self.def(&name("g"), vec![b, gates * h], format!("{} + {e}", gxa(0)))?;
                            Box::new(move |off: usize| format!("{g}[i0, {off} + i1]"))
                        }
                    };
                    let peep = |k: usize, c: &str| {
                        pt.as_ref().map_or(String::new(), |p| format!(" + {p}[{d}, {} + i1] * {c}", k * h))
                    };
                    let cprev = cp.at("i0", "i1");
                    // Gate order i, o, f, c; peepholes i, o, f.
                    let i_g = format!("sigmoid({}{})", ga(0), peep(0, &cprev));
                    let f_g = format!("sigmoid({}{})", ga(2 * h), peep(2, &cprev));
                    let c_in = format!("tanh({})", ga(3 * h));
                    let c_rhs = if matches!(cp, Prev::Zero) {
                        format!("{i_g} * {c_in}")
                    } else {
                        format!("{f_g} * {cprev} + {i_g} * {c_in}")
                    };
                    let c = self.def(&name("c"), vec![b, h], c_rhs)?;
                    let o_g = format!("sigmoid({}{})", ga(h), peep(1, &format!("{c}[i0, i1]")));
                    let hn = self.def(&name("h"), vec![b, h], format!("{o_g} * tanh({c}[i0, i1])"))?;
                    cp = Prev::Step(c.clone());
                    cd[t] = c;
                    hp = Prev::Step(hn.clone());
                    hd[t] = hn;
                } else {
                    // Gate order z, r, h.
                    let zr = match rec(&hp, 0) {
                        Some(e) => format!("{} + {e}", gxa(0)),
                        None => gxa(0),
                    };
                    let z = self.def(&name("z"), vec![b, 2 * h], format!("sigmoid({zr})"))?;
                    let hprev = hp.at("i0", "i1");
                    let cand = if before_reset {
                        // tanh(Xh + r ⊙ (H·Rh + Rbh))
                        match rec(&hp, 2 * h) {
                            Some(e) => format!("tanh({} + {z}[i0, {h} + i1] * ({e}))", gxa(2 * h)),
                            None => format!("tanh({})", gxa(2 * h)),
                        }
                    } else {
                        // tanh(Xh + (r ⊙ H)·Rh + Rbh)
                        let mut e = gxa(2 * h);
                        if !matches!(hp, Prev::Zero) {
                            let rh = format!("{z}[i0, {h} + r0] * {}", hp.at("i0", "r0"));
                            e = format!("{e} + sum[r0 in 0..{h}]({rh} * {rt}[{d}, {} + i1, r0])", 2 * h);
                        }
                        if let Some(bt) = &bt {
                            e = format!("{e} + {bt}[{d}, {} + i1]", 5 * h);
                        }
                        format!("tanh({e})")
                    };
                    let nn = self.def(&name("n"), vec![b, h], cand)?;
                    let rhs = if matches!(hp, Prev::Zero) {
                        format!("(1.0 - {z}[i0, i1]) * {nn}[i0, i1]")
                    } else {
                        format!("(1.0 - {z}[i0, i1]) * {nn}[i0, i1] + {z}[i0, i1] * {hprev}")
                    };
                    let hn = self.def(&name("h"), vec![b, h], rhs)?;
                    hp = Prev::Step(hn.clone());
                    hd[t] = hn;
                }
            }
            hs.push(hd);
            cs.push(cd);
        }
        self.rnn_outputs(n, &hs, &cs, &dirs, [steps, b, h])
    }

    /// `Y` (every step's hidden state), `Y_h` and `Y_c` (the last step's of each direction).
    fn rnn_outputs(
        &mut self,
        n: &NodeProto,
        hs: &[Vec<String>],
        cs: &[Vec<String>],
        dirs: &[bool],
        [steps, b, h]: [usize; 3],
    ) -> R {
        let nd = dirs.len();
        // The last step a direction computes: t = T−1 forward, t = 0 reverse.
        let last = |d: usize| if dirs[d] { 0 } else { steps - 1 };
        // select(dir < 1, parts[0], select(dir < 2, parts[1], …))
        let by_dir = |dir: &str, parts: Vec<String>| -> String {
            let mut e = parts[parts.len() - 1].clone();
            for (d, p) in parts.iter().enumerate().rev().skip(1) {
                e = format!("select({dir} < {}, {p}, {e})", d + 1);
            }
            e
        };
        for (k, o) in n.output.iter().enumerate() {
            if o.is_empty() {
                continue;
            }
            match k {
                0 => {
                    // [T, dirs, B, H]
                    let (tv, dv, bv) = ("i0", "i1", "i2");
                    let per_dir: Vec<String> = (0..nd)
                        .map(|d| {
                            let mut e = format!("{}[{bv}, i3]", hs[d][steps - 1]);
                            for t in (0..steps - 1).rev() {
                                e = format!("select({tv} < {}, {}[{bv}, i3], {e})", t + 1, hs[d][t]);
                            }
                            e
                        })
                        .collect();
                    let e = by_dir(dv, per_dir);
                    let shape = vec![steps, nd, b, h];
                    self.emit_def(o, shape, e)?;
                }
                1 | 2 => {
                    let states = if k == 1 { hs } else { cs };
                    if states[0][0].is_empty() {
                        return Err(format!("output {k} is not an output of this operator"));
                    }
                    // [dirs, B, H]
                    let parts = (0..nd).map(|d| format!("{}[i1, i2]", states[d][last(d)])).collect();
                    let e = by_dir("i0", parts);
                    let shape = vec![nd, b, h];
                    self.emit_def(o, shape, e)?;
                }
                _ => {
                    return Err(format!(
                        "output {k}: the operator has {} outputs",
                        if cs[0][0].is_empty() { 2 } else { 3 }
                    ))
                }
            }
        }
        Ok(())
    }

    /// A statement of the importer's own, `name[i0, …] = rhs`: its identifier.
    fn def(&mut self, name: &str, shape: Vec<usize>, rhs: String) -> R<String> {
        self.emit_def(name, shape, rhs)?;
        let id = self.lookup(name)?;
        Ok(self.value(id).ident.clone())
    }
}
