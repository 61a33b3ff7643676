//! The [`Strategy`] trait: how a role is placed on devices and how its work is split.

mod local;
mod messenger;

pub use local::{LocalGroup, LocalReplica};
pub use messenger::Messenger;
pub use messenger::check_members;

use crate::{Error, Result};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// A device named in a config: `cpu`, `cuda` (= `cuda:0`), `cuda:N`, `vulkan:N` (`vulkan`, `wgpu`
/// and `wgpu:N` are the same devices: Burn's wgpu backend on Vulkan). Backends map it to their
/// own device type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum DeviceSpec {
    /// The host CPU (the default).
    #[default]
    Cpu,
    /// A CUDA GPU by index.
    Cuda(usize),
    /// A Vulkan (wgpu) GPU by index.
    Vulkan(usize),
}

const DEVICE_FORMS: &str = "`cpu`, `cuda`, `cuda:N`, `wgpu` or `vulkan:N` (N = GPU index)";

impl fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Cpu => f.write_str("cpu"),
            Self::Cuda(i) => write!(f, "cuda:{i}"),
            Self::Vulkan(i) => write!(f, "vulkan:{i}"),
        }
    }
}

impl FromStr for DeviceSpec {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let index = |n: &str| n.parse::<usize>().ok();
        let parsed = match s {
            "cpu" => Some(Self::Cpu),
            "cuda" => Some(Self::Cuda(0)),
            "vulkan" | "wgpu" => Some(Self::Vulkan(0)),
            _ => match s.split_once(':') {
                Some(("cuda", n)) => index(n).map(Self::Cuda),
                Some(("vulkan" | "wgpu", n)) => index(n).map(Self::Vulkan),
                _ => None,
            },
        };
        parsed.ok_or_else(|| Error::InvalidValue {
            key: "model.device".into(),
            value: format!("{s:?}"),
            allowed: DEVICE_FORMS.into(),
            origin: None,
        })
    }
}

impl Serialize for DeviceSpec {
    fn serialize<S: serde::Serializer>(
        &self,
        serializer: S,
    ) -> std::result::Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for DeviceSpec {
    fn deserialize<D: serde::Deserializer<'de>>(
        deserializer: D,
    ) -> std::result::Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = DeviceSpec;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(DEVICE_FORMS)
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> std::result::Result<DeviceSpec, E> {
                v.parse()
                    .map_err(|_| E::invalid_value(serde::de::Unexpected::Str(v), &self))
            }
        }
        deserializer.deserialize_str(Visitor)
    }
}

/// A reduction for [`Strategy::all_reduce`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceOp {
    /// Element-wise sum over replicas.
    Sum,
    /// Element-wise mean over replicas.
    Mean,
    /// Element-wise maximum.
    Max,
    /// Element-wise minimum.
    Min,
}

/// How one role's model is laid out on devices and how its work is split: one device, data
/// parallel replicas, or sharded (tensor/pipeline/expert parallel).
///
/// The pipeline never knows which one it got: it asks the strategy to [`partition`](Self::partition)
/// a batch across data-parallel replicas and to [`all_reduce`](Self::all_reduce) the scalars that
/// must agree (token counts for exact loss aggregation, metrics). Model-level collectives
/// (gradient all-reduce, sharded matmuls) live in the backend that implements the strategy.
///
/// # Example
/// ```
/// use roll_core::strategy::{DeviceSpec, ReduceOp, SingleDevice, Strategy};
///
/// let s = SingleDevice::new(DeviceSpec::Cpu);
/// let mut tokens = [12.0, 3.0];
/// s.all_reduce(&mut tokens, ReduceOp::Sum).unwrap(); // one replica: unchanged
/// assert_eq!(tokens, [12.0, 3.0]);
/// assert_eq!(s.partition(&[5, 9, 2]), vec![vec![0, 1, 2]]);
/// ```
pub trait Strategy: Send + Sync {
    /// A short name for logs, e.g. `single_device(cpu)`.
    fn name(&self) -> String;

    /// The devices this replica uses.
    fn devices(&self) -> Vec<DeviceSpec>;

    /// Number of data-parallel replicas.
    fn world_size(&self) -> usize;

    /// This replica's index in `0..world_size()`.
    fn rank(&self) -> usize;

    /// Reduces `values` element-wise across replicas, in place.
    ///
    /// # Errors
    /// If a collective fails.
    fn all_reduce(&self, values: &mut [f32], op: ReduceOp) -> Result<()>;

    /// Replaces `bytes` on every replica by `root`'s: how the leader of a group hands the others
    /// their work (see `roll_backend_burn::train::follow`).
    ///
    /// # Errors
    /// A `root` that is not a rank of the group, or a failed collective.
    fn broadcast(&self, bytes: &mut Vec<u8>, root: usize) -> Result<()>;

    /// Sends `send[d]` to replica `d` and returns, by sender, what every replica sent this
    /// one. `send` has one part per replica; parts may differ in length (an empty part sends
    /// nothing). How expert parallelism dispatches tokens to the replicas that hold their
    /// experts and brings the results back.
    ///
    /// # Errors
    /// `send` without one part per replica, or a failed collective.
    fn all_to_all(&self, send: Vec<Vec<f32>>) -> Result<Vec<Vec<f32>>>;

    /// Tells the other replicas that this one failed and will issue no more collectives, so that
    /// those waiting in one return [`Error::ReplicaFailed`] naming this rank instead of waiting
    /// for ever. Over MPI this ends the job (`MPI_Abort`). A single replica has no one to tell.
    fn abort(&self, reason: &str) {
        let _ = reason;
    }

    /// Assigns sequences (given their token counts) to replicas so that each gets a similar number
    /// of tokens: greedy longest-first onto the least-loaded replica. Returns, per replica, the
    /// sequence indices in ascending order. Deterministic.
    fn partition(&self, token_counts: &[usize]) -> Vec<Vec<usize>> {
        balanced_partition(token_counts, self.world_size().max(1))
    }
}

/// Greedy longest-processing-time partition of items (by weight) into `parts` bins.
pub fn balanced_partition(weights: &[usize], parts: usize) -> Vec<Vec<usize>> {
    let parts = parts.max(1);
    let mut order: Vec<usize> = (0..weights.len()).collect();
    order.sort_by(|&a, &b| weights[b].cmp(&weights[a]).then(a.cmp(&b)));
    let mut load = vec![0usize; parts];
    let mut out = vec![Vec::new(); parts];
    for i in order {
        let (p, _) = load
            .iter()
            .enumerate()
            .min_by_key(|&(p, l)| (*l, p))
            .unwrap_or((0, &0));
        load[p] += weights[i];
        out[p].push(i);
    }
    for part in &mut out {
        part.sort_unstable();
    }
    out
}

/// One replica on one device: the default on a laptop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SingleDevice {
    device: DeviceSpec,
}

impl SingleDevice {
    /// A strategy that runs everything on `device`.
    pub fn new(device: DeviceSpec) -> Self {
        Self { device }
    }

    /// The device.
    pub fn device(&self) -> DeviceSpec {
        self.device
    }
}

impl Strategy for SingleDevice {
    fn name(&self) -> String {
        format!("single_device({})", self.device)
    }
    fn devices(&self) -> Vec<DeviceSpec> {
        vec![self.device]
    }
    fn world_size(&self) -> usize {
        1
    }
    fn rank(&self) -> usize {
        0
    }
    fn all_reduce(&self, _values: &mut [f32], _op: ReduceOp) -> Result<()> {
        Ok(())
    }
    fn broadcast(&self, _bytes: &mut Vec<u8>, root: usize) -> Result<()> {
        if root == 0 {
            return Ok(());
        }
        Err(Error::InvalidValue {
            key: "broadcast root".into(),
            value: root.to_string(),
            allowed: "0 (a single device is rank 0)".into(),
            origin: None,
        })
    }
    fn all_to_all(&self, send: Vec<Vec<f32>>) -> Result<Vec<Vec<f32>>> {
        check_parts(send.len(), 1)?;
        Ok(send)
    }
}

/// `rank` must be a rank of a group of `world_size`; `what` names the argument in the error
/// (`broadcast root`, `message receiver`, …).
///
/// # Errors
/// [`Error::InvalidValue`] naming `what`, the rank and the group's size.
pub fn check_rank(rank: usize, world_size: usize, what: &str) -> Result<()> {
    if rank < world_size {
        return Ok(());
    }
    Err(Error::InvalidValue {
        key: what.into(),
        value: rank.to_string(),
        allowed: format!("a rank below {world_size}"),
        origin: None,
    })
}

/// An all-to-all's send parts must be one per replica.
///
/// # Errors
/// [`Error::InvalidValue`] naming both counts.
pub fn check_parts(parts: usize, world_size: usize) -> Result<()> {
    if parts == world_size {
        return Ok(());
    }
    Err(Error::InvalidValue {
        key: "all-to-all parts".into(),
        value: parts.to_string(),
        allowed: format!("one per replica: {world_size}"),
        origin: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_specs_parse_and_print_round_trip() {
        for s in ["cpu", "cuda:1", "vulkan:0"] {
            assert_eq!(s.parse::<DeviceSpec>().unwrap().to_string(), s);
        }
        assert_eq!("cuda".parse::<DeviceSpec>().unwrap(), DeviceSpec::Cuda(0));
        assert_eq!("wgpu".parse::<DeviceSpec>().unwrap(), DeviceSpec::Vulkan(0));
        assert_eq!(
            "wgpu:2".parse::<DeviceSpec>().unwrap(),
            DeviceSpec::Vulkan(2)
        );
        for bad in ["tpu:0", "gpu", "cuda:", "cuda:x", "cuda:-1", "CPU"] {
            let err = bad.parse::<DeviceSpec>().unwrap_err().to_string();
            assert!(
                err.contains("model.device") && err.contains("cuda:N"),
                "{err}"
            );
        }
    }

    #[test]
    fn partition_balances_tokens_across_replicas() {
        let parts = balanced_partition(&[10, 1, 7, 3, 3], 2);
        let load = |p: &Vec<usize>| p.iter().map(|&i| [10, 1, 7, 3, 3][i]).sum::<usize>();
        assert_eq!(parts.len(), 2);
        assert_eq!(load(&parts[0]) + load(&parts[1]), 24);
        // Longest first: 10→a, 7→b, 3→b, 3→a (tie goes to the first), 1→b: 13 vs 11, the best
        // split of these items (12/12 is impossible).
        assert_eq!((load(&parts[0]), load(&parts[1])), (13, 11));
        let mut all: Vec<usize> = parts.concat();
        all.sort_unstable();
        assert_eq!(all, vec![0, 1, 2, 3, 4]);
    }
}
