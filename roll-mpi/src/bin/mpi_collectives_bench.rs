//! The speed of [`roll_mpi::MpiReplica`]'s collectives, run under `mpirun -np N`: for each size,
//! the median time of an all-reduce (sum of `f32`s: what a data-parallel step pays for its
//! gradients) and of a broadcast of as many bytes as those floats take (what a weight sync would
//! pay), over repeated calls. Rank 0 prints one line per size.
//!
//! Then the latency of small collectives (median of 2,000 calls, in µs): an all-reduce of one
//! float and an all-to-all of 64 floats per rank, over the world, over a sub-group of every
//! rank, over a sub-group of all ranks but the last (with 3 ranks or more) — which makes a
//! communicator for each call (`MPI_Comm_create_group`) — and over a channel of every rank
//! (`Messenger::channel`, which makes one for each call too, with its own tag), alone and while
//! a second thread of every rank waits in a broadcast of the world's (as a follower's trainer
//! waits for the next step while its engine steps).
//!
//! Not a criterion benchmark: criterion picks its iteration counts per process, and every rank
//! must make the same calls. Build it in release:
//! `cargo build --release -p roll-mpi --features mpi --bin mpi_collectives_bench`, then
//! `mpirun -np 2 target/release/mpi_collectives_bench`.

use roll_core::strategy::{DeviceSpec, Messenger, ReduceOp, Strategy};
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
    small_collectives(&me)?;
    Ok(())
}

/// Rank 0 prints the latency of small collectives over the world and over sub-groups.
fn small_collectives(me: &roll_mpi::MpiReplica) -> Result<(), Box<dyn std::error::Error>> {
    const CALLS: usize = 2000;
    let n = me.world_size();
    let every: Vec<usize> = (0..n).collect();
    let all = me.subgroup(&every)?;
    // Every rank forms the group; the last, not a member, sits out its collectives.
    let some = me.subgroup(&every[..n - 1])?;
    if me.rank() == 0 {
        println!("small collectives | all-reduce of 1 float (µs) | all-to-all of 64 floats (µs)");
    }
    let time = |name: &str, strategy: &dyn Strategy| -> Result<(), Box<dyn std::error::Error>> {
        let (mut reduce, mut exchange) = (Vec::new(), Vec::new());
        for _ in 0..CALLS {
            let t = Instant::now();
            strategy.all_reduce(&mut [1.0], ReduceOp::Sum)?;
            reduce.push(t.elapsed().as_secs_f64());
        }
        for _ in 0..CALLS {
            let parts = vec![vec![1.0f32; 64]; strategy.world_size()];
            let t = Instant::now();
            strategy.all_to_all(parts)?;
            exchange.push(t.elapsed().as_secs_f64());
        }
        if me.rank() == 0 {
            println!(
                "| {name} | {:.1} | {:.1}",
                median(&mut reduce) * 1e6,
                median(&mut exchange) * 1e6
            );
        }
        Ok(())
    };
    time(&format!("world of {n} ranks"), me)?;
    if let Some(all) = &all {
        time(&format!("sub-group of all {n} ranks"), all.as_ref())?;
    }
    let channel = me.channel()?;
    time(&format!("channel of all {n} ranks"), channel.as_ref())?;
    std::thread::scope(|s| -> Result<(), Box<dyn std::error::Error>> {
        // Rank 0 releases the others' broadcast once every rank's channel is timed.
        let waiting = s.spawn(|| {
            if me.rank() != 0 {
                me.broadcast(&mut Vec::new(), 0)
                    .map_err(|e| e.to_string())?;
            }
            Ok::<(), String>(())
        });
        let beside = format!("channel of all {n} ranks, a broadcast waiting beside it");
        time(&beside, channel.as_ref())?;
        channel.all_reduce(&mut [0.0], ReduceOp::Sum)?;
        if me.rank() == 0 {
            me.broadcast(&mut Vec::new(), 0)?;
        }
        waiting
            .join()
            .map_err(|_| "the waiting thread panicked")??;
        Ok(())
    })?;
    if n >= 3 {
        if let Some(group) = &some {
            time(
                &format!("sub-group of ranks 0 to {}", n - 2),
                group.as_ref(),
            )?;
        }
        me.all_reduce(&mut [0.0], ReduceOp::Sum)?;
    }
    Ok(())
}

fn median(times: &mut [f64]) -> f64 {
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}
