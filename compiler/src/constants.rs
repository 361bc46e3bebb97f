//! Constant stages: the stages of a program that read nothing but constants
//! (an imported model's weights, and scalars of known value) are split off
//! into a *prologue* that runs once, and the program that runs on every call
//! (*main*) takes what the prologue computes as inputs. Batch-norm folding,
//! Winograd's filter transform `U = G g Gᵀ` and im2col's weight matrix are
//! such stages: inference engines compute them when a model is loaded, not
//! per image.
//!
//! Invariants of a [`Split`]: both programs keep `p`'s tensor table, scalars
//! and expression arena (ids are unchanged); every stage of `p` is in exactly
//! one of them, in its original order; the prologue's outputs are exactly the
//! prologue tensors main reads (the *frontier*), which are inputs of main,
//! appended to its parameters under C-identifier names; main's parameters
//! are `p`'s, less the constants it no longer reads. A program output is
//! never folded. Neither program carries operator records (`ops`): they
//! describe the program as written, which [`Split`] does not change.

use crate::tir::{Program, ProgramParam, TExpr, TExprId, TensorId, TensorRole};
use std::collections::HashSet;

/// A folded tensor may be this many times larger than the constant inputs it
/// derives from (Winograd F(4×4, 3×3)'s filter transform: 36/9 = 4), plus
/// [`GROWTH_SLACK`] elements: beyond that, reading it on every call would cost
/// more memory traffic than computing it from its smaller sources.
const MAX_GROWTH: i64 = 4;
const GROWTH_SLACK: i64 = 4096;

/// `p` cut into the stages that run once and those that run on every call.
pub struct Split {
    /// The constant stages: parameters are the constants (tensors, then
    /// scalars, in `p`'s order) they read; outputs are the frontier.
    pub prologue: Program,
    /// The remaining stages, with the frontier as extra inputs.
    pub main: Program,
    /// The frontier tensors, in the order of the prologue's outputs (and of
    /// main's last parameters): their names in both programs.
    pub frontier: Vec<TensorId>,
}

/// Split `p` given which tensor parameters are constants and which scalars
/// have known values (by name); `None` when no stage reads only constants.
pub fn split(p: &Program, constant_input: &dyn Fn(&str) -> bool, known_scalar: &dyn Fn(&str) -> bool) -> Option<Split> {
    let n = p.tensors.len();
    let (constant, folded) = marks(p, constant_input, known_scalar);
    if !folded.contains(&true) {
        return None;
    }
    let produced: HashSet<TensorId> =
        p.stages.iter().zip(&folded).filter(|(_, &f)| f).map(|(st, _)| st.tensor).collect();
    let (mut read_by_main, mut read_by_prologue) = (HashSet::new(), HashSet::new());
    let mut scalars_of_prologue = HashSet::new();
    for (st, &f) in p.stages.iter().zip(&folded) {
        let (tensors, scalars) = reads(p, st.value);
        if f {
            read_by_prologue.extend(tensors);
            scalars_of_prologue.extend(scalars);
        } else {
            read_by_main.extend(tensors);
        }
    }
    let frontier: Vec<TensorId> =
        (0..n as u32).map(TensorId).filter(|t| produced.contains(t) && read_by_main.contains(t)).collect();
    let names = identifier_names(p, &frontier);

    let mut main = p.clone();
    main.ops.clear();
    main.stages = p.stages.iter().zip(&folded).filter(|(_, &f)| !f).map(|(st, _)| st.clone()).collect();
    main.params.retain(|q| match q {
        ProgramParam::Tensor(t) => !constant[t.0 as usize] || read_by_main.contains(t),
        ProgramParam::Scalar(_) => true,
    });
    for (&t, name) in frontier.iter().zip(&names) {
        let d = &mut main.tensors[t.0 as usize];
        d.role = TensorRole::Input;
        d.name = name.clone();
        main.params.push(ProgramParam::Tensor(t));
    }

    let mut prologue = p.clone();
    prologue.ops.clear();
    prologue.name = format!("{}_constants", p.name);
    prologue.stages = p.stages.iter().zip(&folded).filter(|(_, &f)| f).map(|(st, _)| st.clone()).collect();
    prologue.params.retain(|q| match q {
        ProgramParam::Tensor(t) => read_by_prologue.contains(t),
        ProgramParam::Scalar(s) => scalars_of_prologue.contains(s),
    });
    for d in &mut prologue.tensors {
        if d.role == TensorRole::Output {
            d.role = TensorRole::Temp;
        }
    }
    for (&t, name) in frontier.iter().zip(&names) {
        let d = &mut prologue.tensors[t.0 as usize];
        d.role = TensorRole::Output;
        d.name = name.clone();
    }
    prologue.outputs = frontier.clone();
    Some(Split { prologue, main, frontier })
}

/// A prologue cut into programs that run one after another, so that the
/// constants can be computed a few weights at a time (each part's inputs
/// freed once it has run) rather than with every weight, its buffer and
/// every result held at once. A part is a batch of connected components of
/// the stages (linked by the tensors they write and read, parameters
/// included), taken in order while the bytes of their parameters and
/// outputs stay within `max_bytes`; a component larger than that is a part
/// of its own.
///
/// Invariants: every stage is in exactly one part, in its original order;
/// every tensor parameter is read by exactly one part; a part's outputs are
/// the prologue's outputs its stages write, and nothing it reads is
/// written by another part. Parts keep the prologue's tensor table, names
/// and expression arena.
pub fn parts(prologue: &Program, max_bytes: u64) -> Vec<Program> {
    let components = components(prologue);
    let bytes = |t: TensorId| {
        let d = prologue.tensor(t);
        (d.len().max(0) as u64).saturating_mul(d.elem.size() as u64)
    };
    let mut batches: Vec<Vec<usize>> = Vec::new();
    let mut batch_bytes = 0u64;
    for comp in components {
        let (tensors, _) = component_params(prologue, &comp);
        let outputs = prologue.outputs.iter().filter(|t| comp.iter().any(|&s| prologue.stages[s].tensor == **t));
        let size = tensors.iter().chain(outputs).map(|&t| bytes(t)).fold(0u64, u64::saturating_add);
        match batches.last_mut() {
            Some(b) if batch_bytes.saturating_add(size) <= max_bytes => {
                b.extend(comp);
                batch_bytes += size;
            }
            _ => {
                batches.push(comp);
                batch_bytes = size;
            }
        }
    }
    batches
        .into_iter()
        .map(|mut stages| {
            part(prologue, {
                stages.sort_unstable();
                stages
            })
        })
        .collect()
}

/// The stages of `p` in connected components (each sorted, components in
/// the order of their first stage): two stages are connected when one
/// reads or writes a tensor the other writes, or both read one parameter.
fn components(p: &Program) -> Vec<Vec<usize>> {
    let n = p.stages.len();
    let mut parent: Vec<usize> = (0..n).collect();
    fn root(parent: &mut [usize], mut x: usize) -> usize {
        while parent[x] != x {
            parent[x] = parent[parent[x]];
            x = parent[x];
        }
        x
    }
    // The first stage that touched each tensor stands for it.
    let mut owner: Vec<Option<usize>> = vec![None; p.tensors.len()];
    for (si, st) in p.stages.iter().enumerate() {
        let (reads, _) = reads(p, st.value);
        for t in reads.into_iter().chain([st.tensor]) {
            match owner[t.0 as usize] {
                Some(o) => {
                    let (a, b) = (root(&mut parent, o), root(&mut parent, si));
                    parent[a.max(b)] = a.min(b);
                }
                None => owner[t.0 as usize] = Some(si),
            }
        }
    }
    let mut by_root: Vec<Vec<usize>> = vec![Vec::new(); n];
    for si in 0..n {
        let r = root(&mut parent, si);
        by_root[r].push(si);
    }
    by_root.into_iter().filter(|c| !c.is_empty()).collect()
}

/// The tensor and scalar parameters of `p` the stages `stages` read.
fn component_params(p: &Program, stages: &[usize]) -> (Vec<TensorId>, Vec<u32>) {
    let (mut tensors, mut scalars) = (HashSet::new(), HashSet::new());
    for &s in stages {
        let (t, sc) = reads(p, p.stages[s].value);
        tensors.extend(t);
        scalars.extend(sc);
    }
    let params = p.params.iter();
    let t = params.clone().filter_map(|q| match q {
        ProgramParam::Tensor(t) if tensors.contains(t) => Some(*t),
        _ => None,
    });
    let s = params.filter_map(|q| match q {
        ProgramParam::Scalar(s) if scalars.contains(s) => Some(*s),
        _ => None,
    });
    (t.collect(), s.collect())
}

/// The program of `p`'s stages `stages` (sorted): the parameters they
/// read, and the outputs of `p` they write.
fn part(p: &Program, stages: Vec<usize>) -> Program {
    let (tensors, scalars) = component_params(p, &stages);
    let written: HashSet<TensorId> = stages.iter().map(|&s| p.stages[s].tensor).collect();
    let mut q = p.clone();
    q.stages = stages.iter().map(|&s| p.stages[s].clone()).collect();
    q.params.retain(|param| match param {
        ProgramParam::Tensor(t) => tensors.contains(t),
        ProgramParam::Scalar(s) => scalars.contains(s),
    });
    q.outputs.retain(|t| written.contains(t));
    for d in &mut q.tensors {
        if d.role == TensorRole::Output {
            d.role = TensorRole::Temp;
        }
    }
    for &t in &q.outputs {
        q.tensors[t.0 as usize].role = TensorRole::Output;
    }
    q
}

/// Which tensors of `p` are constants (inputs `constant_input` names, and
/// what the stages that fold compute), and which stages fold.
pub fn constant_tensors(
    p: &Program,
    constant_input: &dyn Fn(&str) -> bool,
    known_scalar: &dyn Fn(&str) -> bool,
) -> Vec<bool> {
    marks(p, constant_input, known_scalar).0
}

/// The constant tensors of `p` and the stages that fold (see [`split`]).
fn marks(
    p: &Program,
    constant_input: &dyn Fn(&str) -> bool,
    known_scalar: &dyn Fn(&str) -> bool,
) -> (Vec<bool>, Vec<bool>) {
    let n = p.tensors.len();
    let mut constant = vec![false; n];
    // Elements of the constant parameters a constant tensor derives from.
    let mut source = vec![0i64; n];
    for t in p.input_tensors() {
        if constant_input(&p.tensor(t).name) {
            constant[t.0 as usize] = true;
            source[t.0 as usize] = p.tensor(t).len();
        }
    }
    let mut folded = vec![false; p.stages.len()];
    for (si, st) in p.stages.iter().enumerate() {
        let decl = p.tensor(st.tensor);
        if decl.role == TensorRole::Output {
            continue;
        }
        let mut read = HashSet::new();
        if !reads_only_constants(p, st.value, &constant, known_scalar, &mut read) {
            continue;
        }
        let from: i64 = read.iter().map(|t: &TensorId| source[t.0 as usize]).sum();
        if decl.len() > MAX_GROWTH.saturating_mul(from).saturating_add(GROWTH_SLACK) {
            continue;
        }
        folded[si] = true;
        constant[st.tensor.0 as usize] = true;
        source[st.tensor.0 as usize] = from;
    }
    (constant, folded)
}

/// Whether `e` reads only constant tensors and known scalars (collecting the tensors it reads).
fn reads_only_constants(
    p: &Program,
    e: TExprId,
    constant: &[bool],
    known_scalar: &dyn Fn(&str) -> bool,
    read: &mut HashSet<TensorId>,
) -> bool {
    let here = match p.expr(e) {
        TExpr::Load(t, _) => {
            read.insert(*t);
            constant[t.0 as usize]
        }
        TExpr::Scalar(s) => known_scalar(&p.scalars[*s as usize].name),
        _ => true,
    };
    here && p.children(e).into_iter().all(|c| reads_only_constants(p, c, constant, known_scalar, read))
}

/// The tensors and scalars `e` reads.
fn reads(p: &Program, e: TExprId) -> (HashSet<TensorId>, HashSet<u32>) {
    let (mut tensors, mut scalars) = (HashSet::new(), HashSet::new());
    let mut stack = vec![e];
    while let Some(e) = stack.pop() {
        match p.expr(e) {
            TExpr::Load(t, _) => {
                tensors.insert(*t);
            }
            TExpr::Scalar(s) => {
                scalars.insert(*s);
            }
            _ => {}
        }
        stack.extend(p.children(e));
    }
    (tensors, scalars)
}

/// C keywords and type names a generated header could not use as parameter names.
const C_KEYWORDS: &[&str] = &[
    "auto", "break", "case", "char", "const", "continue", "default", "do", "double", "else", "enum", "extern", "float",
    "for", "goto", "if", "inline", "int", "long", "register", "restrict", "return", "short", "signed", "sizeof",
    "static", "struct", "switch", "typedef", "union", "unsigned", "void", "volatile", "while", "bool", "size_t",
    "int32_t", "int64_t", "uint8_t", "int8_t",
];

/// Names for the frontier that are C identifiers (they become parameters of
/// a C entry) and clash with no other tensor or scalar of `p`: the tensor's
/// name with every other character made `_` (`conv.Wm` → `conv_Wm`).
fn identifier_names(p: &Program, frontier: &[TensorId]) -> Vec<String> {
    let mut taken: HashSet<String> = p.tensors.iter().map(|t| t.name.clone()).collect();
    taken.extend(p.scalars.iter().map(|s| s.name.clone()));
    frontier
        .iter()
        .map(|&t| {
            let name = &p.tensor(t).name;
            let base: String =
                name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' }).collect();
            let base = if base.starts_with(|c: char| c.is_ascii_digit()) || C_KEYWORDS.contains(&base.as_str()) {
                format!("_{base}")
            } else {
                base
            };
            if base == *name {
                return base;
            }
            let fresh = (0..)
                .map(|k| if k == 0 { base.clone() } else { format!("{base}_{k}") })
                .find(|c| !taken.contains(c))
                .expect("a free name");
            taken.insert(fresh.clone());
            fresh
        })
        .collect()
}
