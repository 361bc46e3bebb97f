//! `cargo fuzz run loops_text`: any bytes as a `.loops` file must give a
//! spanned diagnostic or a loop nest that is proven safe, prints back to text
//! that parses to the same print (the format round-trips), and legalizes
//! for every target; never a panic, a stack overflow or a hang.
#![no_main]

use libfuzzer_sys::fuzz_target;
use texc_grammar::span::SourceMap;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let mut sm = SourceMap::new();
    let id = sm.add("fuzz.loops", text.to_string());
    let Ok(parsed) = texc_schedules::text::parse(text, id) else { return };
    let printed = texc_schedules::ir::print(&parsed.func);
    let id2 = sm.add("printed.loops", printed.clone());
    let again = texc_schedules::text::parse(&printed, id2).expect("printed loop nests parse");
    assert_eq!(texc_schedules::ir::print(&again.func), printed, "print(parse(print(f))) == print(f)");
    for t in texc_compiler::target::all().iter().filter(|t| t.is_compiled()) {
        let mut f = parsed.func.clone();
        texc_schedules::legalize::legalize(&mut f, t);
        texc_schedules::verify::verify_legal(&f, t).expect("legalized nests verify");
    }
});
