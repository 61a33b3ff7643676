//! The dashboards people already use, beside `metrics.jsonl`: TensorBoard event files
//! (`run.tensorboard`) and a Prometheus endpoint on loopback (`run.prometheus_port`).
//!
//! Both are fed from the one [`metrics`] facade, so they see the same numbers from everywhere:
//! [`Run`](super::Run) mirrors every line it appends to `metrics.jsonl` as gauges named
//! `<stage>/<key>` (`rl/reward/mean`, `rl/domain/math/score_mean`, `eval/accuracy`,
//! `sft/loss`, ...), and the components count what the run loop never sees (rewards scored and
//! their latency per domain, environment incidents per environment, prompts drawn per domain).
//!
//! A run that asks for either sink installs roll's recorder as the process's global `metrics`
//! recorder (once; a process whose global recorder is someone else's gets a clear error) and
//! attaches its sinks to it for its lifetime. One run at a time can own the sinks.
//!
//! TensorBoard's x axis is a step, which the facade does not carry: the run sets the gauge
//! [`STEP_GAUGE`] after each line, and the TensorBoard sink then writes every value set since
//! the previous line as one event per tag at that step (counters as their running totals), so
//! counts made during a step's rollout land on that step. Histograms (latencies) are left to
//! Prometheus.

use roll_core::{Error, Result};
use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::{Duration, SystemTime};

use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, SharedString, Unit};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle, PrometheusRecorder};
use tfrecord::protobuf::event::What;
use tfrecord::{Event, EventWriter, EventWriterConfig};

/// The gauge whose value is the step of the line just recorded (TensorBoard's x axis).
pub const STEP_GAUGE: &str = "roll_step";

/// Where a run's TensorBoard event files go, under its output directory.
pub const TENSORBOARD_DIR: &str = "tensorboard";

/// A run's sinks; dropping it detaches them (the Prometheus endpoint stops, the event file is
/// flushed).
pub(crate) struct Telemetry {
    sinks: Arc<Sinks>,
    endpoint: Option<Endpoint>,
}

impl Telemetry {
    /// The sinks `tensorboard` and `prometheus_port` ask for, attached to the facade; `None` when
    /// neither is asked for (the facade is then left alone).
    ///
    /// # Errors
    /// Another recorder owns the facade, another run's sinks are attached, the event file
    /// cannot be created, or the port cannot be bound.
    pub fn start(
        output_dir: &Path,
        tensorboard: bool,
        prometheus_port: Option<u16>,
    ) -> Result<Option<Self>> {
        if !tensorboard && prometheus_port.is_none() {
            return Ok(None);
        }
        let hub = install()?;
        let tensorboard = if tensorboard {
            Some(TensorBoard::create(&output_dir.join(TENSORBOARD_DIR))?)
        } else {
            None
        };
        let (prometheus, endpoint) = match prometheus_port {
            Some(port) => {
                let recorder = PrometheusBuilder::new().build_recorder();
                let endpoint = Endpoint::serve(port, recorder.handle())?;
                (Some(recorder), Some(endpoint))
            }
            None => (None, None),
        };
        let sinks = Arc::new(Sinks {
            prometheus,
            tensorboard,
        });
        {
            let mut active = hub.active.write().unwrap_or_else(|e| e.into_inner());
            if active.is_some() {
                return Err(Error::invalid_data(
                    "run",
                    "another run in this process is already writing TensorBoard or Prometheus \
                     metrics; one run at a time can (set `run.tensorboard = false` and no \
                     `run.prometheus_port` for the others)",
                ));
            }
            *active = Some(sinks.clone());
        }
        if let Some(endpoint) = &endpoint {
            tracing::info!(address = %endpoint.address, "serving Prometheus metrics at /metrics");
        }
        Ok(Some(Self { sinks, endpoint }))
    }

    /// Where the Prometheus endpoint listens (the port is the OS's pick for port 0).
    pub fn prometheus_address(&self) -> Option<SocketAddr> {
        self.endpoint.as_ref().map(|e| e.address)
    }

    /// Fails if the TensorBoard sink could not write (the first error it met), so a full disk
    /// stops the run rather than losing the dashboard silently.
    pub fn check(&self) -> Result<()> {
        match &self.sinks.tensorboard {
            Some(tb) => tb.check(),
            None => Ok(()),
        }
    }
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        if let Some(hub) = HUB.get().and_then(|h| h.as_ref().ok()) {
            let mut active = hub.active.write().unwrap_or_else(|e| e.into_inner());
            if active.as_ref().is_some_and(|s| Arc::ptr_eq(s, &self.sinks)) {
                *active = None;
            }
        }
        if let Some(tb) = &self.sinks.tensorboard {
            tb.flush_pending();
        }
    }
}

/// roll's global recorder: forwards to the sinks of the run that owns it, if any.
struct Hub {
    active: RwLock<Option<Arc<Sinks>>>,
}

static HUB: OnceLock<std::result::Result<&'static Hub, String>> = OnceLock::new();

/// Installs roll's recorder as the global one (once per process).
fn install() -> Result<&'static Hub> {
    let installed = HUB.get_or_init(|| {
        let hub: &'static Hub = Box::leak(Box::new(Hub {
            active: RwLock::new(None),
        }));
        metrics::set_global_recorder(HubRecorder(hub))
            .map(|()| hub)
            .map_err(|e| e.to_string())
    });
    installed.as_ref().copied().map_err(|why| {
        Error::invalid_data(
            "run",
            format!(
                "TensorBoard and Prometheus metrics need roll's recorder as the process's \
                 `metrics` recorder, and another one is installed ({why}); turn off \
                 `run.tensorboard` and `run.prometheus_port`, or read roll's metrics from your \
                 own recorder"
            ),
        )
    })
}

struct HubRecorder(&'static Hub);

impl HubRecorder {
    fn sinks(&self) -> Option<Arc<Sinks>> {
        self.0
            .active
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Calls `f` with the attached Prometheus recorder, if any.
    fn prometheus<T>(&self, f: impl FnOnce(&PrometheusRecorder) -> T) -> Option<T> {
        self.sinks().and_then(|s| s.prometheus.as_ref().map(f))
    }

    /// A handle for `key` in each attached sink (`register` makes Prometheus' own); `None` when
    /// no run owns the sinks.
    fn fanout<P>(
        &self,
        key: &Key,
        register: impl FnOnce(&PrometheusRecorder) -> P,
    ) -> Option<Fanout<P>> {
        let sinks = self.sinks()?;
        Some(Fanout {
            prometheus: sinks.prometheus.as_ref().map(register),
            tensorboard: sinks.tensorboard.clone().map(|tb| (tb, tag(key))),
        })
    }
}

impl metrics::Recorder for HubRecorder {
    fn describe_counter(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.prometheus(|p| p.describe_counter(key, unit, description));
    }

    fn describe_gauge(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.prometheus(|p| p.describe_gauge(key, unit, description));
    }

    fn describe_histogram(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.prometheus(|p| p.describe_histogram(key, unit, description));
    }

    fn register_counter(&self, key: &Key, metadata: &Metadata<'_>) -> Counter {
        self.fanout(key, |p| {
            metrics::Recorder::register_counter(p, key, metadata)
        })
        .map_or_else(Counter::noop, |f| Counter::from_arc(Arc::new(f)))
    }

    fn register_gauge(&self, key: &Key, metadata: &Metadata<'_>) -> Gauge {
        self.fanout(key, |p| metrics::Recorder::register_gauge(p, key, metadata))
            .map_or_else(Gauge::noop, |f| Gauge::from_arc(Arc::new(f)))
    }

    /// Histograms (latencies) go to Prometheus only.
    fn register_histogram(&self, key: &Key, metadata: &Metadata<'_>) -> Histogram {
        self.prometheus(|p| metrics::Recorder::register_histogram(p, key, metadata))
            .unwrap_or_else(Histogram::noop)
    }
}

/// The sinks of one run.
struct Sinks {
    prometheus: Option<PrometheusRecorder>,
    tensorboard: Option<Arc<TensorBoard>>,
}

/// A TensorBoard tag for a facade key: its name, then its labels as `/label=value`.
fn tag(key: &Key) -> String {
    let mut tag = key.name().to_owned();
    for label in key.labels() {
        tag.push_str(&format!("/{}={}", label.key(), label.value()));
    }
    tag
}

/// One metric handle, forwarded to each sink that wants it.
struct Fanout<P> {
    prometheus: Option<P>,
    tensorboard: Option<(Arc<TensorBoard>, String)>,
}

impl metrics::CounterFn for Fanout<Counter> {
    fn increment(&self, value: u64) {
        if let Some(p) = &self.prometheus {
            p.increment(value);
        }
        if let Some((tb, tag)) = &self.tensorboard {
            tb.update(tag, |total| total + value as f64);
        }
    }

    fn absolute(&self, value: u64) {
        if let Some(p) = &self.prometheus {
            p.absolute(value);
        }
        if let Some((tb, tag)) = &self.tensorboard {
            tb.update(tag, |_| value as f64);
        }
    }
}

impl metrics::GaugeFn for Fanout<Gauge> {
    fn increment(&self, value: f64) {
        if let Some(p) = &self.prometheus {
            p.increment(value);
        }
        if let Some((tb, tag)) = &self.tensorboard {
            tb.update(tag, |v| v + value);
        }
    }

    fn decrement(&self, value: f64) {
        if let Some(p) = &self.prometheus {
            p.decrement(value);
        }
        if let Some((tb, tag)) = &self.tensorboard {
            tb.update(tag, |v| v - value);
        }
    }

    fn set(&self, value: f64) {
        if let Some(p) = &self.prometheus {
            p.set(value);
        }
        if let Some((tb, tag)) = &self.tensorboard {
            if tag == STEP_GAUGE {
                tb.write_step(value);
            } else {
                tb.update(tag, |_| value);
            }
        }
    }
}

/// The TensorBoard sink: an event file and the values set since the last step.
struct TensorBoard {
    state: Mutex<TbState>,
    path: PathBuf,
}

struct TbState {
    writer: EventWriter<BufWriter<File>>,
    /// Every tag's current value (counters: their totals).
    values: BTreeMap<String, f64>,
    /// Tags set since the last step was written.
    pending: BTreeSet<String>,
    /// The last step written.
    step: i64,
    /// The first write error; the run stops on it at its next line.
    error: Option<String>,
}

impl TensorBoard {
    fn create(dir: &Path) -> Result<Arc<Self>> {
        std::fs::create_dir_all(dir)
            .map_err(super::io("cannot create the TensorBoard directory", dir))?;
        let secs = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or_default();
        // TensorBoard reads every file with `tfevents` in its name; a resumed run adds a file.
        let path = dir.join(format!(
            "events.out.tfevents.{secs}.roll.{}",
            std::process::id()
        ));
        let fail = |e: tfrecord::Error| {
            Error::invalid_data("TensorBoard", format!("{}: {e}", path.display()))
        };
        let mut writer =
            EventWriter::create(&path, EventWriterConfig { auto_flush: false }).map_err(fail)?;
        // The version record TensorBoard expects first in an event file.
        writer
            .write_event(Event {
                wall_time: wall_time(),
                step: 0,
                what: Some(What::FileVersion("brain.Event:2".into())),
                source_metadata: None,
            })
            .and_then(|()| writer.flush())
            .map_err(fail)?;
        Ok(Arc::new(Self {
            state: Mutex::new(TbState {
                writer,
                values: BTreeMap::new(),
                pending: BTreeSet::new(),
                step: 0,
                error: None,
            }),
            path,
        }))
    }

    fn update(&self, tag: &str, f: impl FnOnce(f64) -> f64) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let value = s.values.entry(tag.to_owned()).or_insert(0.0);
        *value = f(*value);
        if !s.pending.contains(tag) {
            s.pending.insert(tag.to_owned());
        }
    }

    /// Writes the pending values at `step` (the step of the line just recorded).
    fn write_step(&self, step: f64) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.step = step as i64;
        s.write_pending();
    }

    /// Writes what is pending at the last step (the run is ending).
    fn flush_pending(&self) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.write_pending();
    }

    fn check(&self) -> Result<()> {
        let s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        match &s.error {
            Some(e) => Err(Error::invalid_data(
                "TensorBoard",
                format!("cannot write {}: {e}", self.path.display()),
            )),
            None => Ok(()),
        }
    }
}

impl TbState {
    fn write_pending(&mut self) {
        let pending = std::mem::take(&mut self.pending);
        if self.error.is_some() || pending.is_empty() {
            return;
        }
        let wall = wall_time();
        let mut written = Ok(());
        for tag in &pending {
            let value = self.values.get(tag).copied().unwrap_or_default();
            written = self
                .writer
                .write_scalar(tag.as_str(), (self.step, wall), value as f32);
            if written.is_err() {
                break;
            }
        }
        if let Err(e) = written.and_then(|()| self.writer.flush()) {
            self.error = Some(e.to_string());
        }
    }
}

fn wall_time() -> f64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or_default()
}

/// The Prometheus endpoint: `GET /metrics` on a loopback port answered by a thread, in
/// Prometheus' text format. Loopback only: the numbers are the run's, not the network's.
struct Endpoint {
    address: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// Longest request head read before answering.
const MAX_REQUEST: usize = 8 * 1024;

impl Endpoint {
    fn serve(port: u16, handle: PrometheusHandle) -> Result<Self> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, port)).map_err(|e| {
            Error::invalid_data(
                "run.prometheus_port",
                format!("cannot listen on 127.0.0.1:{port}: {e}"),
            )
        })?;
        let address = listener.local_addr().map_err(|e| {
            Error::invalid_data("run.prometheus_port", format!("no local address: {e}"))
        })?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::Builder::new()
            .name("roll-prometheus".into())
            .spawn(move || {
                for stream in listener.incoming() {
                    if stopped.load(Ordering::SeqCst) {
                        break;
                    }
                    if let Ok(stream) = stream {
                        handle.run_upkeep();
                        // A client that misbehaves costs its own connection only.
                        let _ = answer(stream, &handle);
                    }
                }
            })
            .map_err(|e| {
                Error::invalid_data(
                    "run.prometheus_port",
                    format!("cannot start its thread: {e}"),
                )
            })?;
        Ok(Self {
            address,
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the thread blocked in `accept` so it sees the flag.
        let _ = TcpStream::connect_timeout(&self.address, Duration::from_secs(1));
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Answers one HTTP/1 request: the metrics for `GET /metrics`, 404 for any other path, 405 for
/// any other method.
fn answer(mut stream: TcpStream, handle: &PrometheusHandle) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.set_write_timeout(Some(Duration::from_secs(5)))?;
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < MAX_REQUEST {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    let line = String::from_utf8_lossy(&head);
    let mut parts = line.split_whitespace();
    let (status, body) = match (parts.next(), parts.next()) {
        (Some("GET"), Some("/metrics")) => ("200 OK", handle.render()),
        (Some("GET"), _) => ("404 Not Found", "only /metrics is served\n".to_owned()),
        _ => ("405 Method Not Allowed", "GET /metrics\n".to_owned()),
    };
    write!(
        stream,
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    stream.flush()
}
