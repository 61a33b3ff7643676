//! Run under `mpirun -np N`: every collective of [`roll_mpi::MpiReplica`] against values worked
//! out by hand. Prints `rank R of N: collectives ok` and exits 0, or says what differed and
//! exits 1.

use roll_core::strategy::{DeviceSpec, ReduceOp, Strategy};
use roll_mpi::MpiWorld;
use std::process::ExitCode;

fn main() -> ExitCode {
    match check() {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}

fn check() -> Result<String, String> {
    let world = MpiWorld::init().map_err(|e| e.to_string())?;
    let me = world.replica(DeviceSpec::Cpu);
    let (r, n) = (me.rank() as f32, me.world_size() as f32);
    // Σ r over ranks = n(n−1)/2.
    let triangle = n * (n - 1.0) / 2.0;
    let cases = [
        (ReduceOp::Sum, [r, 1.0], [triangle, n]),
        (ReduceOp::Mean, [r, 2.0], [triangle / n, 2.0]),
        (ReduceOp::Max, [r, -r], [n - 1.0, 0.0]),
        (ReduceOp::Min, [r, -r], [0.0, 1.0 - n]),
    ];
    for (op, mine, want) in cases {
        let mut v = mine;
        me.all_reduce(&mut v, op).map_err(|e| e.to_string())?;
        if v != want {
            return Err(format!(
                "rank {r}: {op:?} of {mine:?} gave {v:?}, not {want:?}"
            ));
        }
    }
    // The last rank broadcasts a message longer than the others' buffers.
    let root = me.world_size() - 1;
    let mut bytes = if me.rank() == root {
        b"from the last rank".to_vec()
    } else {
        vec![0; 3]
    };
    me.broadcast(&mut bytes, root).map_err(|e| e.to_string())?;
    if bytes != b"from the last rank" {
        return Err(format!("rank {r}: the broadcast delivered {bytes:?}"));
    }
    if me.broadcast(&mut bytes, me.world_size()).is_ok() {
        return Err("a broadcast from a rank outside the job was accepted".into());
    }
    Ok(format!(
        "rank {} of {}: collectives ok",
        me.rank(),
        me.world_size()
    ))
}
