//! Run under `mpirun -np N`: every collective of [`roll_mpi::MpiReplica`] against values worked
//! out by hand (all-reduce, broadcast, all-to-all), its point-to-point messages and a
//! sub-group's collectives, and a channel's collectives and messages on a second thread beside
//! the job's. Prints `rank R of N: collectives ok, messages ok, sub-group ok, channel ok` and
//! exits 0, or says what differed and exits 1.

use roll_core::strategy::{DeviceSpec, Messenger, ReduceOp, Strategy};
use roll_mpi::MpiWorld;
use std::process::ExitCode;
use std::time::Duration;

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
    // Nothing to broadcast is a broadcast too (a barrier).
    let mut nothing = if me.rank() == 0 {
        Vec::new()
    } else {
        vec![1, 2]
    };
    me.broadcast(&mut nothing, 0).map_err(|e| e.to_string())?;
    if !nothing.is_empty() {
        return Err(format!(
            "rank {r}: an empty broadcast delivered {nothing:?}"
        ));
    }
    if me.broadcast(&mut bytes, me.world_size()).is_ok() {
        return Err("a broadcast from a rank outside the job was accepted".into());
    }
    messages(&me)?;
    subgroups(&me)?;
    channel(&me)?;
    let n = me.world_size();
    // Rank s sends rank d `s` copies of `10s + d` (rank 0 sends nothing).
    let send = (0..n)
        .map(|d| vec![(10 * me.rank() + d) as f32; me.rank()])
        .collect();
    let got = me.all_to_all(send).map_err(|e| e.to_string())?;
    let want: Vec<Vec<f32>> = (0..n)
        .map(|s| vec![(10 * s + me.rank()) as f32; s])
        .collect();
    if got != want {
        return Err(format!(
            "rank {r}: the all-to-all delivered {got:?}, not {want:?}"
        ));
    }
    Ok(format!(
        "rank {} of {}: collectives ok, messages ok, sub-group ok, channel ok",
        me.rank(),
        me.world_size()
    ))
}

/// Rank 0 sends every other rank three messages, the last of 16 MiB (past every transport's
/// eager limit, so the send waits for the receiver); each answers with what it received.
fn messages(me: &roll_mpi::MpiReplica) -> Result<(), String> {
    let err = |e: roll_core::Error| e.to_string();
    let wait = Duration::from_secs(60);
    let big = |rank: usize| -> Vec<u8> { (0..16 << 20).map(|i| (i % 251 + rank) as u8).collect() };
    if me.rank() == 0 {
        for peer in 1..me.world_size() {
            for bytes in [b"one".to_vec(), Vec::new(), big(peer)] {
                me.send(peer, &bytes).map_err(err)?;
            }
        }
        for peer in 1..me.world_size() {
            let reply = me.receive(peer, wait).map_err(err)?;
            let want = format!("rank {peer}: one, 0 bytes, {} bytes intact", 16 << 20);
            if reply.as_deref() != Some(want.as_bytes()) {
                return Err(format!("rank 0: rank {peer} replied {reply:?}"));
            }
        }
    } else {
        let mut got = Vec::new();
        for _ in 0..3 {
            got.push(
                me.receive(0, wait)
                    .map_err(err)?
                    .ok_or("no message in 60 s")?,
            );
        }
        let intact = got[2] == big(me.rank());
        let reply = format!(
            "rank {}: {}, {} bytes, {} bytes {}",
            me.rank(),
            String::from_utf8_lossy(&got[0]),
            got[1].len(),
            got[2].len(),
            if intact { "intact" } else { "changed" }
        );
        me.send(0, reply.as_bytes()).map_err(err)?;
    }
    if me.receive(0, Duration::ZERO).map_err(err)?.is_some() {
        return Err(format!("rank {}: a message nobody sent", me.rank()));
    }
    if me.send(me.world_size(), &[]).is_ok() {
        return Err("a message to a rank outside the job was accepted".into());
    }
    Ok(())
}

/// The first and the last rank form a group: its sums cover them alone, while the other ranks
/// are not asked to take part (with 3 ranks or more: a communicator made among them); then the
/// whole job forms a group of every rank (the world's communicator), and reduces again.
fn subgroups(me: &roll_mpi::MpiReplica) -> Result<(), String> {
    let last = me.world_size() - 1;
    let ends = if last == 0 { vec![0] } else { vec![0, last] };
    subgroup(me, &ends)?;
    subgroup(me, &(0..=last).collect::<Vec<_>>())
}

/// The group of `members` sums their ranks, and its first member broadcasts to it.
fn subgroup(me: &roll_mpi::MpiReplica, members: &[usize]) -> Result<(), String> {
    let err = |e: roll_core::Error| e.to_string();
    match me.subgroup(members).map_err(err)? {
        Some(group) => {
            let mut v = [me.rank() as f32];
            group.all_reduce(&mut v, ReduceOp::Sum).map_err(err)?;
            let mut bytes = if group.rank() == 0 {
                b"group".to_vec()
            } else {
                Vec::new()
            };
            group.broadcast(&mut bytes, 0).map_err(err)?;
            let sum = members.iter().sum::<usize>() as f32;
            if v[0] != sum || bytes != b"group" || group.world_size() != members.len() {
                return Err(format!(
                    "rank {}: the group reduced {v:?}, broadcast {bytes:?}",
                    me.rank()
                ));
            }
        }
        None if members.contains(&me.rank()) => return Err("a member got no group".into()),
        None => {}
    }
    let mut all = [1.0];
    me.all_reduce(&mut all, ReduceOp::Sum).map_err(err)?;
    if all[0] != me.world_size() as f32 {
        return Err(format!(
            "rank {}: the job's sum after the group's was {all:?}",
            me.rank()
        ));
    }
    Ok(())
}

/// Every rank's second thread reduces twenty times on a channel of the whole job and exchanges a
/// message on it, while the first waits in a broadcast of the job's that the last rank roots
/// only once its own second thread is done: under one queue of calls per process (or on one
/// communicator) the ranks would wait for each other for ever.
fn channel(me: &roll_mpi::MpiReplica) -> Result<(), String> {
    let err = |e: roll_core::Error| e.to_string();
    let channel = me.channel().map_err(err)?;
    let (rank, n) = (me.rank(), me.world_size());
    let root = n - 1;
    std::thread::scope(|s| {
        let beside = s.spawn(|| -> Result<(), String> {
            for i in 0..20 {
                let mut v = [(rank + i) as f32];
                channel.all_reduce(&mut v, ReduceOp::Sum).map_err(err)?;
                let want = (n * (n - 1) / 2 + n * i) as f32;
                if v[0] != want {
                    return Err(format!("rank {rank}: the channel summed {v:?}, not {want}"));
                }
            }
            // A message from the last rank to the first on the channel, which the job's own
            // receive does not see.
            if n > 1 && rank == root {
                channel.send(0, b"on the channel").map_err(err)?;
            }
            if n > 1 && rank == 0 {
                let got = channel
                    .receive(root, Duration::from_secs(60))
                    .map_err(err)?;
                if got.as_deref() != Some(&b"on the channel"[..]) {
                    return Err(format!("rank 0: the channel delivered {got:?}"));
                }
            }
            Ok(())
        });
        if rank == root {
            while !beside.is_finished() {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        let mut bytes = if rank == root {
            b"after".to_vec()
        } else {
            Vec::new()
        };
        me.broadcast(&mut bytes, root).map_err(err)?;
        beside
            .join()
            .map_err(|_| format!("rank {rank}: the channel's thread panicked"))??;
        if bytes != b"after" {
            return Err(format!(
                "rank {rank}: the broadcast beside the channel gave {bytes:?}"
            ));
        }
        Ok(())
    })
}
