//! Loop-nest evaluator: runs a [`LoopFunc`] statement by statement on the
//! interpreter's memory and expression evaluator. It executes exactly the
//! loops, guards and accumulation order that the schedule produced, so
//! comparing it with the interpreter checks lowering and scheduling
//! independently of any code generator.

use crate::ir::{LoopFunc, Stmt};
use texc_compiler::interp::{Arg, InterpError, Machine};
use texc_runtime::Tensor;

pub fn run(f: &LoopFunc, args: Vec<Arg>) -> Result<Vec<Tensor>, InterpError> {
    let mut m = Machine::new(&f.p, args)?;
    let mut env = vec![0i64; f.vars.len()];
    exec(f, &mut m, &f.body, &mut env)?;
    Ok(m.outputs())
}

fn exec(f: &LoopFunc, m: &mut Machine, body: &[Stmt], env: &mut Vec<i64>) -> Result<(), InterpError> {
    for s in body {
        match s {
            Stmt::Barrier => {}
            Stmt::For { var, lo, extent, body, .. } => {
                for x in *lo..*lo + *extent {
                    env[*var as usize] = x;
                    exec(f, m, body, env)?;
                }
            }
            Stmt::Alloc { body, .. } => exec(f, m, body, env)?,
            Stmt::If { cond, then } => {
                if m.eval(&f.vars, *cond, env)?.b() {
                    exec(f, m, then, env)?;
                }
            }
            Stmt::Store { tensor, indices, value } => {
                let idx =
                    indices.iter().map(|&i| m.eval(&f.vars, i, env).map(|v| v.i())).collect::<Result<Vec<_>, _>>()?;
                let v = m.eval(&f.vars, *value, env)?;
                m.store(*tensor, &idx, v)?;
            }
        }
    }
    Ok(())
}
