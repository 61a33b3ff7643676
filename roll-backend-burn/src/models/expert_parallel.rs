//! Expert parallelism for Qwen3-MoE: each rank of a group holds one block of every mixture's
//! experts; tokens travel to the ranks holding their experts and the results travel back, with
//! two [`Strategy::all_to_all`]s per mixture layer (GShard, Lepikhin et al. 2020,
//! arXiv:2006.16668; ROLL's Megatron `expert_model_parallel_size`).
//!
//! The exchange goes through host memory, outside autodiff. A sharded model scores (reference
//! and old log-probs, evaluation), and it trains on Burn's autodiff path block by block
//! ([`Trainer`] in the data-parallel group that holds the experts): the backward of a mixture
//! sends each routed slot's input and output gradient to its expert's rank, which runs the
//! expert's backward and returns the expert's output and input gradient (`ExpertShard::backward`,
//! two more all-to-alls). It serves an inference engine on every rank of the group, each with
//! requests of its own, on the [`DeviceDecoder`](crate::engine::DeviceDecoder): the engines step
//! together ([`lockstep`](crate::engine::lockstep)). The HF writer (which would save a part of
//! the experts) refuses it.
//!
//! Every rank of the group must run each forward together, with its own batch (any size), as
//! the collectives require: the same number of [`CausalLm::forward`] calls on every rank, in
//! the same order. (Scoring's micro-batching cuts batches of different sizes into different
//! numbers of forwards: call the forward directly, one batch per rank per call.) A rank with
//! nothing to run still serves its experts (`ExpertShard::serve_forward`,
//! `ExpertShard::backward` without slots of its own).
//!
//! [`CausalLm::forward`]: crate::CausalLm::forward
//!
//! [`Trainer`]: crate::train::Trainer

use super::mlp::Mlp;
use burn::optim::GradientsParams;
use burn::tensor::{Device, IndexingUpdateOp, Int, Tensor, TensorData};
use roll_core::strategy::Strategy;
use std::ops::Range;
use std::sync::Arc;

/// Which block of the experts this rank holds, and the group that holds the others. Rank `r`
/// of `W` holds experts `⌊r·E/W⌋ .. ⌊(r+1)·E/W⌋` of `E`.
#[derive(Clone)]
pub struct ExpertShard {
    group: Arc<dyn Strategy>,
    num_experts: usize,
    /// Where several such groups train data-parallel: the ranks holding the same experts in
    /// the others (this one among them), over which the experts' gradients are summed.
    replicas: Option<Arc<dyn Strategy>>,
}

impl std::fmt::Debug for ExpertShard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExpertShard")
            .field("group", &self.group.name())
            .field("experts", &self.range(self.group.rank()))
            .finish()
    }
}

impl ExpertShard {
    /// This rank's share of `num_experts` experts over `group` (no more ranks than experts:
    /// [`CausalLm::shard_experts`](crate::CausalLm::shard_experts) checks).
    pub(crate) fn new(group: Arc<dyn Strategy>, num_experts: usize) -> Self {
        Self {
            group,
            num_experts,
            replicas: None,
        }
    }

    /// The ranks holding the same experts in the other groups of a data-parallel job, if any.
    pub(crate) fn replicas(&self) -> Option<&Arc<dyn Strategy>> {
        self.replicas.as_ref()
    }

    /// This shard, with `replicas` as the ranks holding the same experts in the other groups.
    pub(crate) fn with_replicas(mut self, replicas: Arc<dyn Strategy>) -> Self {
        self.replicas = Some(replicas);
        self
    }

    /// The same experts on this rank, exchanged over `group` (of the same size, this rank at
    /// the same place: the caller checks), without replicas.
    pub(crate) fn over(self, group: Arc<dyn Strategy>) -> Self {
        Self {
            group,
            num_experts: self.num_experts,
            replicas: None,
        }
    }

    /// The experts rank `rank` holds.
    pub fn range(&self, rank: usize) -> Range<usize> {
        expert_block(rank, self.group.world_size(), self.num_experts)
    }

    /// The rank holding expert `e`.
    fn owner(&self, expert: usize) -> usize {
        (0..self.group.world_size())
            .find(|&r| self.range(r).contains(&expert))
            .unwrap_or(0)
    }

    /// This rank's experts.
    pub(crate) fn mine(&self) -> Range<usize> {
        self.range(self.group.rank())
    }

    /// The group holding the experts.
    pub(crate) fn group(&self) -> &Arc<dyn Strategy> {
        &self.group
    }

    /// This rank's part of a forward in which it routes no tokens of its own: it runs its
    /// `experts` on what the others send, and answers.
    ///
    /// # Errors
    /// A failed all-to-all, or a record naming an expert this rank does not hold.
    pub(crate) fn serve_forward(
        &self,
        hidden: usize,
        experts: &[Mlp],
        device: &Device,
    ) -> roll_core::Result<()> {
        let received = self
            .group
            .all_to_all(vec![Vec::new(); self.group.world_size()])?;
        let reply = received
            .iter()
            .map(|records| run_experts(records, hidden, experts, device))
            .collect::<roll_core::Result<Vec<_>>>()?;
        self.group.all_to_all(reply)?;
        Ok(())
    }

    /// The experts' part of a mixture's backward, on every rank of the group together.
    ///
    /// `slots` is this rank's routed tokens, if it has any. Each slot goes to its expert's rank, which computes `y = E(x)` and `∂⟨y, g⟩/∂x = J_Eᵀ g`
    /// with the expert's parameter gradients, and answers. Returns, per slot of this rank in slot
    /// order, `y` and `J_Eᵀ g` (each `[tokens·top_k, hidden]`), and the gradients of this rank's
    /// `experts` (on the autodiff device `device`) over every rank's tokens.
    ///
    /// # Errors
    /// A failed all-to-all, an answer of the wrong length, or a record naming an expert this
    /// rank does not hold.
    pub(crate) fn backward(
        &self,
        slots: Option<RoutedSlots<'_>>,
        hidden: usize,
        experts: &[Mlp],
        device: &Device,
    ) -> roll_core::Result<(Vec<f32>, Vec<f32>, GradientsParams)> {
        let ranks = self.group.world_size();
        // Dispatch: per destination, one record per slot: the expert's index there, `x`, `g`.
        let mut slots_to: Vec<Vec<usize>> = vec![Vec::new(); ranks];
        let mut send: Vec<Vec<f32>> = vec![Vec::new(); ranks];
        let mut count = 0;
        if let Some(RoutedSlots {
            x,
            chosen,
            top_k,
            g,
        }) = slots
        {
            count = chosen.len();
            for (slot, &e) in chosen.iter().enumerate() {
                let Ok(e) = usize::try_from(e) else { continue };
                let (token, to) = (slot / top_k, self.owner(e));
                slots_to[to].push(slot);
                send[to].push((e - self.range(to).start) as f32);
                send[to].extend_from_slice(&x[token * hidden..(token + 1) * hidden]);
                send[to].extend_from_slice(&g[slot * hidden..(slot + 1) * hidden]);
            }
        }
        let received = self.group.all_to_all(send)?;
        let (reply, grads) = expert_backward(&received, hidden, experts, device)?;
        let results = self.group.all_to_all(reply)?;
        let mut y = vec![0f32; count * hidden];
        let mut gx = vec![0f32; count * hidden];
        for (to, routed) in slots_to.iter().enumerate() {
            if results[to].len() != routed.len() * 2 * hidden {
                return Err(roll_core::Error::Strategy(
                    format!(
                        "rank {to} returned {} values for the backward of {} routed tokens",
                        results[to].len(),
                        routed.len()
                    )
                    .into(),
                ));
            }
            for (&slot, answer) in routed.iter().zip(results[to].chunks_exact(2 * hidden)) {
                let at = slot * hidden..(slot + 1) * hidden;
                y[at.clone()].copy_from_slice(&answer[..hidden]);
                gx[at].copy_from_slice(&answer[hidden..]);
            }
        }
        Ok((y, gx, grads))
    }

    /// The mixture's output for `x` (`[tokens, hidden]`): every routed slot (token, choice, expert
    /// in `chosen`, one row per token with `top_k` choices) is computed on the rank holding its
    /// expert (`experts`: this rank's, in order) and weighted by `weights` (`[tokens·top_k, 1]`).
    pub(crate) fn forward(
        &self,
        x: Tensor<2>,
        chosen: &[i64],
        top_k: usize,
        weights: Tensor<2>,
        experts: &[Mlp],
    ) -> roll_core::Result<Tensor<2>> {
        let [n, hidden] = x.dims();
        let device = x.device();
        let ranks = self.group.world_size();
        let rows: Vec<f32> = x
            .into_data()
            .convert::<f32>()
            .try_into_vec()
            .map_err(|e| roll_core::Error::Strategy(format!("{e:?}").into()))?;
        // Dispatch: per destination rank, one record per slot routed there: the expert's index
        // on that rank, then the token's hidden state.
        let mut slots_to: Vec<Vec<(i32, i32)>> = vec![Vec::new(); ranks];
        let mut send: Vec<Vec<f32>> = vec![Vec::new(); ranks];
        for (slot, &e) in chosen.iter().enumerate() {
            let Ok(e) = usize::try_from(e) else { continue };
            let token = slot / top_k;
            let to = self.owner(e);
            slots_to[to].push((token as i32, slot as i32));
            send[to].push((e - self.range(to).start) as f32);
            send[to].extend_from_slice(&rows[token * hidden..(token + 1) * hidden]);
        }
        let received = self.group.all_to_all(send)?;
        // Each rank's experts on what it received, answered in the order received.
        let reply = received
            .iter()
            .map(|records| run_experts(records, hidden, experts, &device))
            .collect::<roll_core::Result<Vec<_>>>()?;
        let results = self.group.all_to_all(reply)?;
        // Combine: each slot's result, weighted, added to its token.
        let (mut tokens, mut slots, mut values) = (Vec::new(), Vec::new(), Vec::new());
        for (to, routed) in slots_to.iter().enumerate() {
            if results[to].len() != routed.len() * hidden {
                return Err(roll_core::Error::Strategy(
                    format!(
                        "rank {to} returned {} values for {} routed tokens",
                        results[to].len(),
                        routed.len()
                    )
                    .into(),
                ));
            }
            tokens.extend(routed.iter().map(|&(t, _)| t));
            slots.extend(routed.iter().map(|&(_, s)| s));
            values.extend_from_slice(&results[to]);
        }
        let out = Tensor::<2>::zeros([n, hidden], &device);
        let m = tokens.len();
        if m == 0 {
            return Ok(out);
        }
        let y = Tensor::<2>::from_data(TensorData::new(values, [m, hidden]), &device);
        let slots = Tensor::<1, Int>::from_data(TensorData::new(slots, [m]), &device);
        let tokens = Tensor::<1, Int>::from_data(TensorData::new(tokens, [m]), &device);
        Ok(out.select_assign(
            0,
            tokens,
            y * weights.select(0, slots),
            IndexingUpdateOp::Add,
        ))
    }
}

/// The experts rank `rank` of `ranks` holds of `experts`: `⌊rank·E/W⌋ .. ⌊(rank+1)·E/W⌋`.
pub(crate) fn expert_block(rank: usize, ranks: usize, experts: usize) -> Range<usize> {
    rank * experts / ranks..(rank + 1) * experts / ranks
}

/// A rank's routed tokens in a mixture's backward ([`ExpertShard::backward`]).
pub(crate) struct RoutedSlots<'a> {
    /// The mixture's input, `[tokens, hidden]` row-major.
    pub x: &'a [f32],
    /// Each slot's expert: one row of `top_k` per token.
    pub chosen: &'a [i64],
    /// Experts per token.
    pub top_k: usize,
    /// Each slot's output gradient `w·δ`, `[tokens·top_k, hidden]`: the slot's weight times the
    /// gradient of the loss with respect to the token's output.
    pub g: &'a [f32],
}

/// This rank's experts' backward over the records every rank sent it (expert index, `x`, `g`,
/// per record): the answers per sender (`y`, then `J_Eᵀ g`, per record) and the experts'
/// gradients, from one backward over all of them.
fn expert_backward(
    received: &[Vec<f32>],
    hidden: usize,
    experts: &[Mlp],
    device: &Device,
) -> roll_core::Result<(Vec<Vec<f32>>, GradientsParams)> {
    let width = 2 * hidden + 1;
    // Every record, as (sender, index), grouped by expert.
    let mut rows_of: Vec<Vec<(usize, usize)>> = vec![Vec::new(); experts.len()];
    for (from, records) in received.iter().enumerate() {
        for (i, record) in records.chunks_exact(width).enumerate() {
            let e = record[0] as usize;
            rows_of
                .get_mut(e)
                .ok_or_else(|| {
                    roll_core::Error::Strategy(
                        format!("a token routed to missing expert {e}").into(),
                    )
                })?
                .push((from, i));
        }
    }
    let mut reply: Vec<Vec<f32>> = received
        .iter()
        .map(|r| vec![0f32; r.len() / width * 2 * hidden])
        .collect();
    let mut objective: Option<Tensor<1>> = None;
    let mut leaves = Vec::new();
    for (expert, rows) in experts.iter().zip(&rows_of) {
        if rows.is_empty() {
            continue;
        }
        let (mut x, mut g) = (Vec::new(), Vec::new());
        for &(from, i) in rows {
            let record = &received[from][i * width..(i + 1) * width];
            x.extend_from_slice(&record[1..=hidden]);
            g.extend_from_slice(&record[hidden + 1..]);
        }
        let shape = [rows.len(), hidden];
        let leaf = Tensor::<2>::from_data(TensorData::new(x, shape), device).require_grad();
        let g = Tensor::<2>::from_data(TensorData::new(g, shape), device);
        let y = expert.forward(leaf.clone());
        let term = (y.clone() * g).sum();
        objective = Some(match objective {
            Some(sum) => sum + term,
            None => term,
        });
        leaves.push((rows, leaf, y));
    }
    let Some(objective) = objective else {
        return Ok((reply, GradientsParams::new()));
    };
    let grads = objective.backward();
    let values = |t: Tensor<2>| -> roll_core::Result<Vec<f32>> {
        t.into_data()
            .convert::<f32>()
            .try_into_vec()
            .map_err(|e| roll_core::Error::Strategy(format!("{e:?}").into()))
    };
    for (rows, leaf, y) in leaves {
        let dims = leaf.dims();
        let gx = leaf
            .grad(&grads)
            .unwrap_or_else(|| Tensor::zeros(dims, &leaf.device().inner()));
        let (y, gx) = (values(y.inner())?, values(gx)?);
        for (k, &(from, i)) in rows.iter().enumerate() {
            let out = &mut reply[from][i * 2 * hidden..(i + 1) * 2 * hidden];
            out[..hidden].copy_from_slice(&y[k * hidden..(k + 1) * hidden]);
            out[hidden..].copy_from_slice(&gx[k * hidden..(k + 1) * hidden]);
        }
    }
    let experts: Vec<Mlp> = experts.to_vec();
    Ok((reply, GradientsParams::from_grads(grads, &experts)))
}

/// The outputs of this rank's `experts` for `records` (expert index, then `hidden` values, per
/// record), in record order.
fn run_experts(
    records: &[f32],
    hidden: usize,
    experts: &[Mlp],
    device: &Device,
) -> roll_core::Result<Vec<f32>> {
    let width = hidden + 1;
    let count = records.len() / width;
    let mut rows_of: Vec<Vec<usize>> = vec![Vec::new(); experts.len()];
    for (i, record) in records.chunks_exact(width).enumerate() {
        let e = record[0] as usize;
        rows_of
            .get_mut(e)
            .ok_or_else(|| {
                roll_core::Error::Strategy(format!("a token routed to missing expert {e}").into())
            })?
            .push(i);
    }
    let mut out = vec![0f32; count * hidden];
    for (expert, rows) in experts.iter().zip(&rows_of) {
        if rows.is_empty() {
            continue;
        }
        let mut input = Vec::with_capacity(rows.len() * hidden);
        for &i in rows {
            input.extend_from_slice(&records[i * width + 1..(i + 1) * width]);
        }
        let x = Tensor::<2>::from_data(TensorData::new(input, [rows.len(), hidden]), device);
        let y: Vec<f32> = expert
            .forward(x)
            .into_data()
            .convert::<f32>()
            .try_into_vec()
            .map_err(|e| roll_core::Error::Strategy(format!("{e:?}").into()))?;
        for (k, &i) in rows.iter().enumerate() {
            out[i * hidden..(i + 1) * hidden].copy_from_slice(&y[k * hidden..(k + 1) * hidden]);
        }
    }
    Ok(out)
}
