//! The speed of [`roll_mpi::MpiReplica`]'s collectives, run under `mpirun -np N`: for each size,
//! the median time of an all-reduce (sum of `f32`s: what a data-parallel step pays for its
//! gradients) and of a broadcast of as many bytes as those floats take (what a weight sync would
//! pay), over repeated calls. Rank 0 prints one line per size.
//!
//! Not a criterion benchmark: criterion picks its iteration counts per process, and every rank
//! must make the same calls. Build it in release:
//! `cargo build --release -p roll-mpi --features mpi --bin mpi_collectives_bench`, then
//! `mpirun -np 2 target/release/mpi_collectives_bench`.

use roll_core::strategy::{DeviceSpec, ReduceOp, Strategy};
use roll_mpi::MpiWorld;
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let world = MpiWorld::init()?;
    let me = world.replica(DeviceSpec::Cpu);
    if me.rank() == 0 {
        println!(
            "{} ranks | floats | all-reduce (ms) | GB/s (bus) | broadcast (ms) | GB/s",
            me.world_size()
        );
    }
    let n = me.world_size() as f64;
    for exponent in [10u32, 14, 18, 20, 22, 24, 26] {
        let floats = 1usize << exponent;
        let reps = (1usize << 28 >> exponent).clamp(3, 200);
        let mut values = vec![1.0f32; floats];
        let mut bytes = vec![7u8; floats * 4];
        let mut reduce = Vec::with_capacity(reps);
        let mut broadcast = Vec::with_capacity(reps);
        for _ in 0..reps {
            // Every rank starts the call together, so each time is the collective's own.
            me.all_reduce(&mut [0.0], ReduceOp::Sum)?;
            let t = Instant::now();
            me.all_reduce(&mut values, ReduceOp::Sum)?;
            reduce.push(t.elapsed().as_secs_f64());
            me.all_reduce(&mut [0.0], ReduceOp::Sum)?;
            let t = Instant::now();
            me.broadcast(&mut bytes, 0)?;
            broadcast.push(t.elapsed().as_secs_f64());
        }
        if me.rank() == 0 {
            let size = (floats * 4) as f64;
            let (r, b) = (median(&mut reduce), median(&mut broadcast));
            // Bus bandwidth as NCCL reports it: 2(N−1)/N of the buffer through each rank.
            let bus = 2.0 * (n - 1.0) / n * size / r / 1e9;
            println!(
                "| {floats} | {:.3} | {bus:.2} | {:.3} | {:.2}",
                r * 1e3,
                b * 1e3,
                size / b / 1e9
            );
        }
    }
    Ok(())
}

fn median(times: &mut [f64]) -> f64 {
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}
