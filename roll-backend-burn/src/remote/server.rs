//! [`RolloutServer`]: a rollout rank's side of disaggregated rollout.

use super::weights;
use super::wire::{Finished, Report, ToRollout, decode, encode};
use crate::engine::{DecoderKind, Engine, EngineConfig, RequestHandle, ServedWeights};
use crate::{BackendError, CausalLm, Device, Result};
use burn::module::Module;
use roll_core::Tokenizer;
use roll_core::WeightVersion;
use roll_core::policy::GenerationRequest;
use roll_core::strategy::{Messenger, Strategy};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// How long a rollout rank waits for the controller's next message before looking again (it
/// waits for ever in steps of this; the controller's failure ends the wait with an error).
const IDLE_WAIT: Duration = Duration::from_secs(1);

/// How long a weight bucket may take to follow its header.
const BUCKET_WAIT: Duration = Duration::from_secs(600);

/// A rollout rank: an inference engine serving the controller's requests on the weights the
/// controller sends (see the [module docs](super)).
pub struct RolloutServer {
    template: CausalLm,
    tokenizer: Option<Arc<dyn Tokenizer>>,
    engine: EngineConfig,
    decoder: Option<DecoderKind>,
    device: Device,
}

impl std::fmt::Debug for RolloutServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RolloutServer")
            .field("device", &self.device)
            .field("decoder", &self.decoder)
            .finish_non_exhaustive()
    }
}

/// What a rollout rank did before the controller stopped it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Served {
    /// Requests received.
    pub requests: u64,
    /// Weight syncs received, the first (the weights it started on) included.
    pub weight_syncs: u64,
    /// The version of the weights it served last.
    pub version: WeightVersion,
    /// The rollout ranks its last weights' experts were divided among, itself included
    /// ([`RolloutServer::with_experts`]); 1: it held the whole model (0: it got no weights).
    pub expert_parallel: usize,
}

impl RolloutServer {
    /// A server for models of `template`'s architecture (its weights are replaced by the
    /// controller's before anything is generated), on `device`, decoding text with `tokenizer`
    /// (whose EOS also ends every generation). Without one, generations carry token ids and
    /// log-probs only, and end at `max_new_tokens` or a stop token id.
    pub fn new(
        template: CausalLm,
        tokenizer: Option<Arc<dyn Tokenizer>>,
        engine: EngineConfig,
        device: Device,
    ) -> Self {
        Self {
            template: template.to_device(&device),
            tokenizer,
            engine,
            decoder: None,
            device,
        }
    }

    /// Keeps only this rank's block of every mixture's experts, divided among `group` — rollout
    /// ranks each serving requests of their own, whose engines step together (see
    /// [`lockstep`](crate::engine::lockstep)). The controller must send each rank its block
    /// ([`RemoteRollout::connect_with_experts`](super::RemoteRollout::connect_with_experts)):
    /// from here on the rank never holds the other ranks' experts.
    ///
    /// # Errors
    /// [`BackendError::InvalidInput`] for a dense template, or more ranks than experts.
    pub fn with_experts(mut self, group: Arc<dyn Strategy>) -> Result<Self> {
        self.template = self.template.shard_experts(group)?;
        Ok(self)
    }

    /// Forces a decoder (default: [`DecoderKind::auto`]).
    #[must_use]
    pub fn with_decoder(mut self, kind: DecoderKind) -> Self {
        self.decoder = Some(kind);
        self
    }

    /// Serves the controller at rank `controller` of `link` until it says stop: starts the
    /// engine on the first weights it sends, then answers each round and each weight sync.
    ///
    /// Blocking: run it on a thread of its own, not on an async runtime's (its weight syncs
    /// wait for the engine).
    ///
    /// # Errors
    /// A broken link (the controller failed), a message out of protocol, weights that do not
    /// fit the template, an engine that cannot start or sync. A request the engine refuses is
    /// not an error here: its failure goes back to the controller and costs that request alone.
    pub fn serve(self, link: &dyn Messenger, controller: usize) -> Result<Served> {
        let mut state = Serving {
            server: &self,
            link,
            controller,
            engine: None,
            running: BTreeMap::new(),
            refused: Vec::new(),
            served: Served::default(),
        };
        loop {
            let Some(bytes) = link
                .receive(controller, IDLE_WAIT)
                .map_err(|e| state.link_error(e))?
            else {
                continue;
            };
            let stop = match decode(&bytes, controller)? {
                ToRollout::Weights {
                    version,
                    floats,
                    buckets,
                } => {
                    state.take_weights(version, floats, buckets)?;
                    false
                }
                ToRollout::Round { submit, abort } => {
                    let engine = state.engine()?;
                    let (mut started, mut refused) = (Vec::new(), Vec::new());
                    for s in submit {
                        let request = GenerationRequest::new(s.prompt_ids, s.params);
                        match engine.submit(request) {
                            Ok(handle) => started.push((s.id, handle)),
                            Err(e) => refused.push(Finished {
                                id: s.id,
                                outcome: Err(e.to_string()),
                            }),
                        }
                    }
                    state.served.requests += (started.len() + refused.len()) as u64;
                    state.running.extend(started);
                    state.refused.extend(refused);
                    for id in abort {
                        if let Some(handle) = state.running.get(&id) {
                            handle.abort();
                        }
                    }
                    false
                }
                ToRollout::Stop => {
                    state.running.values().for_each(RequestHandle::abort);
                    true
                }
            };
            state.report(stop)?;
            if stop {
                return Ok(state.served);
            }
        }
    }
}

/// One rollout rank's state while it serves.
struct Serving<'a> {
    server: &'a RolloutServer,
    link: &'a dyn Messenger,
    controller: usize,
    engine: Option<(Engine, DecoderKind)>,
    running: BTreeMap<u64, RequestHandle>,
    /// Requests the engine refused, to report in the next answer.
    refused: Vec<Finished>,
    served: Served,
}

impl Serving<'_> {
    fn link_error(&self, e: roll_core::Error) -> BackendError {
        BackendError::RolloutRank {
            rank: self.link.rank(),
            reason: format!("lost the controller (rank {}): {e}", self.controller),
        }
    }

    fn protocol(&self, reason: String) -> BackendError {
        BackendError::RolloutRank {
            rank: self.link.rank(),
            reason,
        }
    }

    fn engine(&self) -> Result<&Engine> {
        self.engine
            .as_ref()
            .map(|(e, _)| e)
            .ok_or_else(|| self.protocol("requests arrived before any weights".into()))
    }

    /// Receives `buckets` weight messages and serves them as `version`: the engine starts on
    /// the first weights and syncs to every later one.
    fn take_weights(&mut self, version: u64, floats: u64, buckets: u32) -> Result<()> {
        let expected = self.server.template.num_params();
        if usize::try_from(floats).ok() != Some(expected) {
            return Err(self.protocol(format!(
                "weights of {floats} floats announced for a model of {expected} parameters \
                 (do both ranks load the same model?)"
            )));
        }
        let mut received = Vec::new();
        for bucket in 0..buckets {
            let bytes = self
                .link
                .receive(self.controller, BUCKET_WAIT)
                .map_err(|e| self.link_error(e))?
                .ok_or_else(|| {
                    self.protocol(format!(
                        "weight bucket {bucket} of {buckets} did not come in {} s",
                        BUCKET_WAIT.as_secs()
                    ))
                })?;
            received.push(bytes);
        }
        // A rank dividing the experts gets its block, into its sharded template.
        let model = weights::load(&self.server.template, &received)?;
        drop(received);
        let expert_parallel = model.expert_group().map_or(1, |g| g.world_size());
        let served = match &self.engine {
            None => {
                let server = self.server;
                let kind = server
                    .decoder
                    .unwrap_or_else(|| DecoderKind::auto(&model, &server.device));
                let config = EngineConfig {
                    start_version: version,
                    ..server.engine.clone()
                };
                let engine = Engine::with_decoder(
                    kind,
                    &model,
                    &server.device,
                    config,
                    server.tokenizer.clone(),
                )?;
                let served = engine.weight_version();
                self.engine = Some((engine, kind));
                served
            }
            Some((engine, kind)) => {
                engine.sync_served_blocking(&ServedWeights::new(model, *kind)?)?
            }
        };
        if served.0 != version {
            return Err(self.protocol(format!(
                "the engine serves weight version {} after a sync to version {version}",
                served.0
            )));
        }
        self.served.weight_syncs += 1;
        self.served.version = served;
        self.served.expert_parallel = expert_parallel;
        Ok(())
    }

    /// Answers the controller with every request that ended since the last answer; with
    /// `wait`, first waits for all running requests to end (they were aborted).
    fn report(&mut self, wait: bool) -> Result<()> {
        let mut finished = std::mem::take(&mut self.refused);
        loop {
            self.running
                .retain(|&id, handle| match handle.try_finish() {
                    Some(outcome) => {
                        finished.push(Finished {
                            id,
                            outcome: outcome.map(Into::into).map_err(|e| e.to_string()),
                        });
                        false
                    }
                    None => true,
                });
            if !wait || self.running.is_empty() {
                break;
            }
            // Aborted requests end at the engine's next step.
            std::thread::sleep(Duration::from_millis(1));
        }
        let version = self
            .engine
            .as_ref()
            .map_or(self.served.version, |(e, _)| e.weight_version());
        let answer = encode(&Report {
            finished,
            version: version.0,
        })?;
        self.link
            .send(self.controller, &answer)
            .map_err(|e| self.link_error(e))
    }
}
