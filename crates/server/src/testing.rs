//! A deterministic fake engine for the HTTP-layer tests: one token per byte (id = byte + 1,
//! id 0 is end-of-generation), a fixed reply, a slot semaphore and a bounded queue, with
//! optional delays to exercise keep-alives and cancellation.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};

use ferrite_engine::StopScanner;
use ferrite_engine::{
    Backend, BackendError, ChatPrompt, EngineStats, FinishReason, GenEvent, GenRequest,
    SubmitError, Timings, TokenLogprob, TopLogprob, Usage,
};

/// The fake engine.
pub struct Fake {
    pub reply: String,
    pub n_ctx: usize,
    pub slots: usize,
    pub queue_limit: usize,
    pub token_delay: Duration,
    pub start_delay: Duration,
    pub submitted: AtomicUsize,
    pub dead: std::sync::atomic::AtomicBool,
    /// Prompt of the latest submitted request.
    pub last_prompt: std::sync::Mutex<Vec<u32>>,
    /// Reasoning budget of the latest submitted request.
    pub last_budget: std::sync::Mutex<Option<ferrite_engine::ReasoningBudget>>,
    /// Render like a template without tool support (tools do not change the prompt).
    pub drops_tools: bool,
    live: Arc<AtomicUsize>,
    running: Arc<AtomicUsize>,
    permits: Arc<Semaphore>,
}

impl Fake {
    pub fn new(reply: &str) -> Fake {
        Fake::with(reply, 2, 4, Duration::ZERO)
    }

    pub fn with(reply: &str, slots: usize, queue_limit: usize, token_delay: Duration) -> Fake {
        Fake {
            reply: reply.to_string(),
            n_ctx: 256,
            slots,
            queue_limit,
            token_delay,
            start_delay: Duration::ZERO,
            submitted: AtomicUsize::new(0),
            dead: std::sync::atomic::AtomicBool::new(false),
            last_prompt: std::sync::Mutex::new(Vec::new()),
            last_budget: std::sync::Mutex::new(None),
            drops_tools: false,
            live: Arc::new(AtomicUsize::new(0)),
            running: Arc::new(AtomicUsize::new(0)),
            permits: Arc::new(Semaphore::new(slots)),
        }
    }
}

/// Decrements a counter when dropped, so every exit path of a fake job is counted.
struct Count(Arc<AtomicUsize>);

impl Drop for Count {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Backend for Fake {
    fn model_id(&self) -> &str {
        "fake-model"
    }
    fn aliases(&self) -> Vec<String> {
        vec!["fake.gguf".to_string()]
    }
    fn n_ctx(&self) -> usize {
        self.n_ctx
    }
    fn vocab_size(&self) -> usize {
        257
    }
    fn tokenize(&self, text: &str, _add_special: bool, _parse_special: bool) -> Vec<u32> {
        text.bytes().map(|b| b as u32 + 1).collect()
    }
    fn detokenize(&self, ids: &[u32]) -> Result<String, BackendError> {
        let bytes: Result<Vec<u8>, _> = ids
            .iter()
            .filter(|&&id| id != 0)
            .map(|&id| u8::try_from(id - 1).map_err(|_| BackendError(format!("bad id {id}"))))
            .collect();
        Ok(String::from_utf8_lossy(&bytes?).into_owned())
    }
    fn is_control_token(&self, _text: &str) -> bool {
        // Every token of the fake is one byte of text.
        false
    }
    fn render_chat(&self, chat: &ChatPrompt) -> Result<String, BackendError> {
        let mut out = String::new();
        for m in &chat.messages {
            let role = m["role"].as_str().unwrap_or("?");
            let content = m["content"].as_str().unwrap_or("");
            out.push_str(&format!("{role}: {content}"));
            for call in m["tool_calls"].as_array().into_iter().flatten() {
                let f = &call["function"];
                out.push_str(&format!(
                    " [call {} {}({})]",
                    call["id"], f["name"], f["arguments"]
                ));
            }
            if let Some(id) = m["tool_call_id"].as_str() {
                out.push_str(&format!(" [answers {id}]"));
            }
            if let Some(r) = m["reasoning_content"].as_str() {
                out.push_str(&format!(" [reasoned {r}]"));
            }
            out.push('\n');
        }
        if chat.tools.is_some() && !self.drops_tools {
            out.push_str("tools: yes\n");
        }
        if !chat.kwargs.is_empty() {
            out.push_str(&format!(
                "kwargs: {}\n",
                serde_json::Value::Object(chat.kwargs.clone())
            ));
        }
        out.push_str("assistant: ");
        Ok(out)
    }
    fn submit(&self, req: GenRequest) -> Result<UnboundedReceiver<GenEvent>, SubmitError> {
        let live = self.live.load(Ordering::SeqCst);
        if live >= self.slots + self.queue_limit {
            return Err(SubmitError::QueueFull {
                queued: live - self.slots,
            });
        }
        self.submitted.fetch_add(1, Ordering::SeqCst);
        if let Ok(mut last) = self.last_prompt.lock() {
            last.clone_from(&req.prompt);
        }
        if let Ok(mut last) = self.last_budget.lock() {
            last.clone_from(&req.reasoning_budget);
        }
        self.live.fetch_add(1, Ordering::SeqCst);
        let live_guard = Count(self.live.clone());
        let running = self.running.clone();
        let permits = self.permits.clone();
        let (tx, rx) = unbounded_channel();
        let reply = self.reply.clone();
        let (token_delay, start_delay) = (self.token_delay, self.start_delay);
        tokio::spawn(async move {
            let _live = live_guard;
            let Ok(_permit) = permits.acquire_owned().await else {
                return;
            };
            running.fetch_add(1, Ordering::SeqCst);
            let _running = Count(running);
            tokio::time::sleep(start_delay).await;
            if tx.send(GenEvent::Started { cached_tokens: 0 }).is_err() {
                return;
            }
            if req.prompt_logprobs {
                // Every prompt token after the first scores -1, its best alternative "~" -2.
                let items = req.prompt[1..]
                    .iter()
                    .map(|&id| {
                        let piece = ((id.saturating_sub(1)) as u8 as char).to_string();
                        TokenLogprob {
                            token: piece.clone(),
                            bytes: piece.clone().into_bytes(),
                            logprob: -1.0,
                            top: [top(&piece, -1.0), top("~", -2.0)]
                                .into_iter()
                                .take(req.logprobs.unwrap_or(0))
                                .collect(),
                        }
                    })
                    .collect();
                if tx.send(GenEvent::PromptLogprobs(items)).is_err() {
                    return;
                }
            }
            let mut scanner = StopScanner::new(&req.stop);
            let mut n = 0;
            for b in reply.bytes() {
                if n >= req.max_tokens {
                    let tail = scanner.finish();
                    let _ = tx.send(done(FinishReason::Length, None, tail, &req, n));
                    return;
                }
                if !token_delay.is_zero() {
                    tokio::time::sleep(token_delay).await;
                }
                if tx.is_closed() {
                    return;
                }
                n += 1;
                let piece = (b as char).to_string();
                let scanned = scanner.push(&piece);
                let logprob = req.logprobs.map(|k| TokenLogprob {
                    token: piece.clone(),
                    bytes: piece.clone().into_bytes(),
                    logprob: -0.5,
                    top: [top(&piece, -0.5), top("~", -1.5)]
                        .into_iter()
                        .take(k)
                        .collect(),
                });
                let _ = tx.send(GenEvent::Token {
                    id: b as u32 + 1,
                    text: scanned.text,
                    logprob,
                });
                if let Some(stop) = scanned.stop {
                    let _ = tx.send(done(FinishReason::Stop, Some(stop), String::new(), &req, n));
                    return;
                }
            }
            let tail = scanner.finish();
            let _ = tx.send(done(FinishReason::Stop, None, tail, &req, n));
        });
        Ok(rx)
    }
    fn healthy(&self) -> bool {
        !self.dead.load(Ordering::SeqCst)
    }
    fn stats(&self) -> EngineStats {
        let live = self.live.load(Ordering::SeqCst);
        let running = self.running.load(Ordering::SeqCst);
        EngineStats {
            slots_total: self.slots,
            slots_active: running,
            queue_depth: live.saturating_sub(running),
            queue_limit: self.queue_limit,
            ..EngineStats::default()
        }
    }
}

/// A fake alternative: its bytes are its text's.
fn top(token: &str, logprob: f32) -> TopLogprob {
    TopLogprob {
        token: token.to_string(),
        bytes: token.as_bytes().to_vec(),
        logprob,
    }
}

fn done(
    finish: FinishReason,
    stop: Option<String>,
    tail: String,
    req: &GenRequest,
    n: usize,
) -> GenEvent {
    GenEvent::Done {
        finish,
        stop_sequence: stop,
        tail,
        usage: Usage {
            prompt_tokens: req.prompt.len(),
            cached_tokens: 0,
            completion_tokens: n,
            ..Usage::default()
        },
        timings: Timings::default(),
    }
}
