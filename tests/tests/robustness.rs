//! The front end never panics, hangs or overflows its stack: random token
//! streams, random mutations of every valid file, deep nesting, huge
//! identifiers, and corrupt .npy files all give errors.

use texc_runtime::{read_npy_bytes, SplitMix64};
use texc_tests::{check_text, root};

const TOKENS: &[&str] = &[
    "kernel",
    "schedule",
    "for",
    "import",
    "const",
    "in",
    "auto",
    "std",
    "nn",
    "(",
    ")",
    "[",
    "]",
    "{",
    "}",
    ",",
    ";",
    ":",
    ".",
    "..",
    "->",
    "=",
    "+",
    "-",
    "*",
    "/",
    "%",
    "<",
    "<=",
    ">",
    ">=",
    "==",
    "!=",
    "&&",
    "||",
    "!",
    "?",
    "A",
    "B",
    "X",
    "i",
    "j",
    "k",
    "N",
    "M",
    "f32",
    "i8",
    "bool",
    "int",
    "sum",
    "max",
    "select",
    "exp",
    "0",
    "1",
    "64",
    "1.5",
    "1e-5",
    "\"x.tex\"",
    "split",
    "tile",
    "by",
    "vectorize",
    "inf",
    "relu",
    "matmul",
    "#c\n",
    "\n",
];

fn no_panic(name: &str, text: &str) {
    let r = std::panic::catch_unwind(|| {
        let _ = check_text(name, text);
    });
    assert!(r.is_ok(), "front end panicked on:\n{text}");
}

#[test]
fn random_token_streams_never_panic() {
    let mut rng = SplitMix64::new(7);
    for _ in 0..1500 {
        let n = 1 + rng.next_u64() % 60;
        let text: Vec<&str> = (0..n).map(|_| TOKENS[(rng.next_u64() % TOKENS.len() as u64) as usize]).collect();
        no_panic("random.tex", &text.join(" "));
    }
}

#[test]
fn mutations_of_valid_files_never_panic() {
    let mut files: Vec<String> = std::fs::read_dir(root().join("examples"))
        .expect("examples/")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "tex"))
        .map(|p| std::fs::read_to_string(p).expect("read"))
        .collect();
    files.push(std::fs::read_to_string(root().join("tests/conformance/std_ops.tex")).expect("read"));
    files.push(texc_compiler::session::STD_NN.to_string());
    let mut rng = SplitMix64::new(11);
    for text in &files {
        let toks: Vec<&str> = text.split_inclusive(|c: char| !c.is_alphanumeric() && c != '_').collect();
        for _ in 0..120 {
            let mut t: Vec<&str> = toks.clone();
            for _ in 0..1 + rng.next_u64() % 3 {
                let i = (rng.next_u64() % t.len() as u64) as usize;
                match rng.next_u64() % 4 {
                    0 => {
                        t.remove(i);
                    }
                    1 => t.insert(i, TOKENS[(rng.next_u64() % TOKENS.len() as u64) as usize]),
                    2 => t[i] = TOKENS[(rng.next_u64() % TOKENS.len() as u64) as usize],
                    _ => {
                        let j = (rng.next_u64() % t.len() as u64) as usize;
                        t.swap(i, j);
                    }
                }
            }
            no_panic("mutant.tex", &t.concat());
        }
    }
}

#[test]
fn twenty_thousand_parentheses_are_an_error() {
    let text =
        format!("kernel f(A: f32[N = 4]) -> B: f32[N] {{ B[i] = {}A[i]{}; }}", "(".repeat(20_000), ")".repeat(20_000));
    let err = check_text("deep.tex", &text).expect_err("too deep");
    assert!(err.contains("nested too deeply"), "{err}");
}

#[test]
fn long_operator_chains_are_an_error_not_a_stack_overflow() {
    let text = format!("kernel f(A: f32[N = 4]) -> B: f32[N] {{ B[i] = A[i]{}; }}", " + A[i]".repeat(50_000));
    let err = check_text("chain.tex", &text).expect_err("too deep");
    assert!(err.contains("nested too deeply"), "{err}");
    let text = format!("kernel f(A: f32[N = 4]) -> B: f32[N] {{ B[i] = {}A[i]; }}", "-".repeat(50_000));
    assert!(check_text("neg.tex", &text).expect_err("too deep").contains("nested too deeply"));
}

#[test]
fn a_100_kb_identifier_is_an_error() {
    let text = format!("kernel f(A: f32[N = 4]) -> B: f32[N] {{ B[i] = {}[i]; }}", "x".repeat(100_000));
    let err = check_text("ident.tex", &text).expect_err("too long");
    assert!(err.contains("identifier is 100000 bytes long"), "{}", &err[..err.len().min(300)]);
    assert!(err.lines().next().expect("a line").len() < 200, "the reason must not echo the identifier");
}

#[test]
fn corrupt_npy_files_are_errors() {
    let dir = texc_tests::scratch("npy");
    std::fs::create_dir_all(&dir).expect("tmp");
    let path = dir.join("a.npy");
    let t = texc_runtime::Tensor::from_f64(texc_runtime::DType::F32, vec![3, 4], &[1.5; 12]);
    texc_runtime::write_npy(&path, &t).expect("write");
    let bytes = std::fs::read(&path).expect("read");
    assert_eq!(read_npy_bytes(&bytes, "a.npy").expect("round trip"), t);
    let mut rng = SplitMix64::new(3);
    for cut in 0..bytes.len() {
        assert!(read_npy_bytes(&bytes[..cut], "a.npy").is_err(), "truncated at {cut} accepted");
    }
    for _ in 0..3000 {
        let mut b = bytes.clone();
        for _ in 0..1 + rng.next_u64() % 4 {
            let i = (rng.next_u64() % b.len() as u64) as usize;
            b[i] = rng.next_u64() as u8;
        }
        let r = std::panic::catch_unwind(|| read_npy_bytes(&b, "fuzz.npy"));
        assert!(r.is_ok(), "npy reader panicked");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn exponential_inlining_is_an_error_not_a_hang() {
    let mut src = String::from("kernel k0(A: f32[N = 2]) -> B: f32[N] { B[i] = A[i]; }\n");
    for n in 1..40 {
        src.push_str(&format!("kernel k{n}(A: f32[N = 2]) -> B: f32[N] {{ T = k{p}(A); B = k{p}(T); }}\n", p = n - 1));
    }
    let start = std::time::Instant::now();
    let err = check_text("exp.tex", &src).expect_err("too many stages");
    assert!(err.contains("stages after inlining"), "{err}");
    assert!(start.elapsed().as_secs() < 60);
}
