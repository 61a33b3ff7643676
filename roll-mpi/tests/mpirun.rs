//! roll-mpi's collectives across real processes: `mpirun -np 2` on this machine.
#![cfg(feature = "mpi")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

/// `mpirun` with the flags a CI container needs (it runs as root, with fewer cores than ranks).
pub fn mpirun(ranks: usize) -> Command {
    let mut cmd = Command::new("mpirun");
    cmd.args(["--allow-run-as-root", "--oversubscribe", "-np"])
        .arg(ranks.to_string());
    cmd
}

/// Runs the check on `ranks` processes; every rank must report it passed.
fn check_on(ranks: usize) {
    let out = mpirun(ranks)
        .arg(env!("CARGO_BIN_EXE_mpi_collectives_check"))
        .output()
        .expect("mpirun not found: install MPI (Debian: openmpi-bin libopenmpi-dev)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    for rank in 0..ranks {
        assert!(
            stdout.contains(&format!(
                "rank {rank} of {ranks}: collectives ok, messages ok, sub-group ok, channel ok"
            )),
            "{stdout}\n{stderr}"
        );
    }
}

#[test]
fn collectives_agree_across_two_processes() {
    check_on(2);
}

/// Three ranks: the first and last form a group of their own, whose collectives make a
/// communicator among them alone (two ranks' group is every rank, the world's communicator).
#[test]
fn a_group_of_some_ranks_agrees_across_three_processes() {
    check_on(3);
}
