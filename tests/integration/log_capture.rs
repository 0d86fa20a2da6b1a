//! Keeps every WARN and ERROR line the operator logs while the suite runs, with the fields of the
//! spans it was logged in, so a test can say "nothing above info about my objects". Tests share
//! one process (and one global subscriber), so a test filters the lines by its own objects'
//! names rather than counting all of them.

use std::fmt::Write as _;
use std::sync::Mutex;

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::filter::filter_fn;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

static LINES: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// The operator's and the test environment's newest lines down to DEBUG, whatever RUST_LOG
/// says: what a timed-out wait prints about its object, since a CI log has no other record
/// of what the reconciles saw.
static RECENT: Mutex<std::collections::VecDeque<String>> =
    Mutex::new(std::collections::VecDeque::new());

/// Lines [`RECENT`] keeps: a few minutes of two tests' reconciles.
const RECENT_KEPT: usize = 100_000;

/// The suite's subscriber: the usual test output (filtered by RUST_LOG, warn by default) and,
/// whatever RUST_LOG says, the capture of WARN and ERROR lines.
pub fn init() {
    questdb_operator::metrics::install_crypto_provider();
    let output = tracing_subscriber::fmt::layer()
        .with_test_writer()
        .with_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn")));
    let _ = tracing_subscriber::registry()
        .with(output)
        .with(Capture.with_filter(filter_fn(|m| {
            // Spans for their fields (the reconcile's object); events when they warn, and
            // the operator's and agents' down to DEBUG for `recent_about`.
            if m.is_span() {
                *m.level() <= Level::INFO
            } else {
                *m.level() <= Level::WARN || ours(m) && *m.level() <= Level::DEBUG
            }
        })))
        .try_init();
}

/// The newest `most` lines of [`RECENT`] that mention each of `needles`.
pub fn recent_about(needles: &[&str], most: usize) -> Vec<String> {
    let recent = RECENT.lock().unwrap();
    let mut lines: Vec<String> = recent
        .iter()
        .rev()
        .filter(|l| needles.iter().all(|n| l.contains(n)))
        .take(most)
        .cloned()
        .collect();
    lines.reverse();
    lines
}

/// How many lines have been captured: a mark to read only what came after it.
pub fn mark() -> usize {
    LINES.lock().unwrap().len()
}

/// The lines captured since `mark` that mention `needle`.
pub fn warnings_since(mark: usize, needle: &str) -> Vec<String> {
    LINES.lock().unwrap()[mark..]
        .iter()
        .filter(|l| l.contains(needle))
        .cloned()
        .collect()
}

struct Capture;

struct SpanFields(String);

#[derive(Default)]
struct Text(String);

impl Visit for Text {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let _ = write!(self.0, " {}={value:?}", field.name());
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        let _ = write!(self.0, " {}={value}", field.name());
    }
}

impl<S> Layer<S> for Capture
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        id: &tracing::span::Id,
        ctx: Context<'_, S>,
    ) {
        if let Some(span) = ctx.span(id) {
            let mut text = Text::default();
            attrs.record(&mut text);
            span.extensions_mut().insert(SpanFields(text.0));
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let line = line(event, &ctx);
        if *event.metadata().level() <= Level::WARN {
            LINES.lock().unwrap().push(line.clone());
        }
        if ours(event.metadata()) {
            let mut recent = RECENT.lock().unwrap();
            if recent.len() >= RECENT_KEPT {
                recent.pop_front();
            }
            recent.push_back(format!("{} {line}", k8s_openapi::jiff::Timestamp::now()));
        }
    }
}

/// The operator's and the test environment's own lines.
fn ours(m: &tracing::Metadata<'_>) -> bool {
    m.target().starts_with("questdb_operator") || m.target().starts_with("questdb_testenv")
}

/// An event as one line: level, target, fields, then each enclosing span with its fields.
fn line<S>(event: &Event<'_>, ctx: &Context<'_, S>) -> String
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    let mut text = Text(format!(
        "{} {}:",
        event.metadata().level(),
        event.metadata().target()
    ));
    event.record(&mut text);
    if let Some(scope) = ctx.event_scope(event) {
        // kube's own span repeats the reconcile span's object.
        for span in scope.filter(|s| s.name() != "reconciling object") {
            let _ = write!(text.0, " [{}", span.name());
            if let Some(fields) = span.extensions().get::<SpanFields>() {
                text.0.push_str(&fields.0);
            }
            text.0.push(']');
        }
    }
    text.0
}
