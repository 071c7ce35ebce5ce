// openai_sdk.mjs - qshard serve through the official OpenAI SDK for Node (npm `openai`, pinned
// in package.json / package-lock.json; `npm ci --prefix tests/serve`). Run by test_serve.sh:
// node tests/serve/openai_sdk.mjs. The SDK parses every response and stream itself, so a
// response it cannot read fails here.
//
// Environment: QSHARD (the binary), QSHARD_SERVE_MODEL (the converted KJV model),
// QSHARD_SERVE_TMP (scratch dir), QSHARD_SAN=1 (sanitizer build: timeouts x3).
// It starts its own servers (--port 0 --device cpu), stops them with SIGTERM (exit 0 checked)
// and kills them on any exit. Prints "ok   name" / "FAIL name: why" per check and, last,
// "# openai_sdk: N passed, M failed", which test_serve.sh sums.
//
// References the server did not produce: HF transformers' greedy continuations of the KJV
// prompts (tests/data/models/INDEX.json) and the offline batch runner (`qshard run --prompts`).
import { spawn, execFileSync } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import OpenAI from 'openai';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const REPO = path.resolve(HERE, '..', '..');
const QSHARD = process.env.QSHARD || 'build/qshard';
const MODEL = process.env.QSHARD_SERVE_MODEL;
const TMP = process.env.QSHARD_SERVE_TMP || '/tmp';
const SLOW = process.env.QSHARD_SAN === '1' ? 3 : 1;

const INDEX = JSON.parse(readFileSync(path.join(REPO, 'tests/data/models/INDEX.json'), 'utf8'));
const GOLD = INDEX.models.find((m) => m.name === 'kjv-llama-awq-gemm');
const [G1, G2, G3] = GOLD.prompts;

let passed = 0;
let failed = 0;
const failures = [];
function check(cond, name, detail = '') {
  if (cond) {
    passed++;
    console.log(`ok   ${name}`);
  } else {
    failed++;
    const d = typeof detail === 'string' ? detail : JSON.stringify(detail);
    const msg = `FAIL ${name}${d ? ': ' + d.slice(0, 600) : ''}`;
    failures.push(msg);
    console.log(msg);
  }
  return !!cond;
}
// the usage fields of the contract (others, such as prompt_tokens_details, may vary with the
// prefix cache)
const U = (u) => u && { prompt_tokens: u.prompt_tokens, completion_tokens: u.completion_tokens, total_tokens: u.total_tokens };
const eq = (got, want, name) =>
  check(JSON.stringify(got) === JSON.stringify(want), name, `got ${JSON.stringify(got)}, want ${JSON.stringify(want)}`);

// --- servers -------------------------------------------------------------------------------
const servers = new Set();
process.on('exit', () => {
  for (const s of servers) try { s.proc.kill('SIGKILL'); } catch { /* gone */ }
});
for (const sig of ['SIGTERM', 'SIGINT', 'SIGHUP']) process.on(sig, () => process.exit(128 + 15));

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function startServer(name, args = []) {
  const proc = spawn(QSHARD, ['serve', MODEL, '--port', '0', '--device', 'cpu', ...args],
    { stdio: ['ignore', 'ignore', 'pipe'] });
  const s = { name, proc, log: '', exited: null };
  servers.add(s);
  proc.stderr.setEncoding('utf8');
  proc.stderr.on('data', (d) => { s.log += d; });   // always drained: a full pipe would block it
  s.exit = new Promise((res) => proc.on('exit', (code, signal) => { s.exited = { code, signal }; res(s.exited); }));
  const until = async (re, secs) => {
    const t0 = Date.now();
    while (Date.now() - t0 < secs * 1000) {
      const m = s.log.match(re);
      if (m) return m;
      if (s.exited) break;
      await sleep(50);
    }
    return s.log.match(re);
  };
  const m = await until(/^qshard serve: listening on http:\/\/([^\s:]+):(\d+)\s*$/m, 30 * SLOW);
  if (!m) throw new Error(`${name}: no listening line; log:\n${s.log.slice(-2000)}`);
  s.url = `http://${m[1]}:${m[2]}`;
  if (!(await until(/^qshard serve: ready\s*$/m, 60 * SLOW)))
    throw new Error(`${name}: no ready line; log:\n${s.log.slice(-2000)}`);
  return s;
}

async function stopServer(s, secs = 20 * SLOW) {
  s.proc.kill('SIGTERM');
  const r = await Promise.race([s.exit, sleep(secs * 1000).then(() => null)]);
  if (!r) s.proc.kill('SIGKILL');
  servers.delete(s);
  check(r && r.code === 0 && r.signal === null, `${s.name} server: SIGTERM -> exit 0 within ${secs}s`,
    `exit ${JSON.stringify(r)}; log:\n${s.log.slice(-1500)}`);
}

function client(s, apiKey = 'unused') {
  // maxRetries 0: a retried 429/5xx would hide a failure
  return new OpenAI({ baseURL: `${s.url}/v1`, apiKey, maxRetries: 0, timeout: 120000 * SLOW });
}

let nOff = 0;
function offline(requests, extra = []) {
  const f = path.join(TMP, `sdk-offline-${nOff++}.jsonl`);
  writeFileSync(f, requests.map((r) => JSON.stringify(r)).join('\n') + '\n');
  const out = execFileSync(QSHARD, ['run', MODEL, '--prompts', f, '--device', 'cpu', ...extra],
    { stdio: ['ignore', 'pipe', 'ignore'], timeout: 120000 * SLOW }).toString();
  return out.trim().split('\n').map((l) => JSON.parse(l));
}

async function run(name, fn) {
  let timer;
  try {
    await Promise.race([fn(), new Promise((_, rej) => { timer = setTimeout(() => rej(new Error('timed out')), 120000 * SLOW); })]);
  } catch (e) {
    check(false, name, `exception ${e && e.constructor && e.constructor.name}: ${e && e.message}`);
  } finally {
    clearTimeout(timer);
  }
}

function usageOk(u, name) {
  return check(u && Number.isInteger(u.prompt_tokens) && Number.isInteger(u.completion_tokens) &&
    u.total_tokens === u.prompt_tokens + u.completion_tokens, `${name}: usage total = prompt + completion`, u);
}

function fieldsOk(r, object, idPrefix, name) {
  check(typeof r.id === 'string' && r.id.startsWith(idPrefix), `${name}: id '${idPrefix}...'`, r.id);
  eq(r.object, object, `${name}: object`);
  check(Number.isInteger(r.created) && Math.abs(r.created - Date.now() / 1000) < 600, `${name}: created = now`, r.created);
  eq(r.model, MODEL, `${name}: model = served name`);
  check(Array.isArray(r.choices) && r.choices.length >= 1, `${name}: choices`, r.choices);
}

// --- cases ---------------------------------------------------------------------------------
async function tModels(c) {
  const list = [];
  for await (const m of c.models.list()) list.push(m);
  eq(list.length, 1, 'models.list: one model');
  eq(list[0] && list[0].id, MODEL, 'models.list: id = MODEL_DIR as given');
  eq(list[0] && list[0].object, 'model', 'models.list: object model');
  eq(list[0] && list[0].owned_by, 'qshard', 'models.list: owned_by qshard');
}

async function tCompletions(c) {
  for (const g of [G1, G2, G3]) {
    const r = await c.completions.create({ model: MODEL, prompt: g.text, max_tokens: 16, temperature: 0 });
    fieldsOk(r, 'text_completion', 'cmpl-', `completions ${g.name}`);
    eq(r.choices[0].text, ' ' + g.greedy_text, `completions ${g.name}: greedy text = HF generate()`);
    eq(r.choices[0].index, 0, `completions ${g.name}: index 0`);
    eq(r.choices[0].finish_reason, 'length', `completions ${g.name}: finish_reason length`);
    eq(r.usage.prompt_tokens, g.ids.length, `completions ${g.name}: prompt_tokens = HF ids`);
    eq(r.usage.completion_tokens, 16, `completions ${g.name}: completion_tokens 16`);
    usageOk(r.usage, `completions ${g.name}`);
  }
}

async function tCompletionsStream(c) {
  const ref = await c.completions.create({ model: MODEL, prompt: G2.text, max_tokens: 20, temperature: 0 });
  const stream = await c.completions.create({ model: MODEL, prompt: G2.text, max_tokens: 20, temperature: 0, stream: true });
  let text = '';
  const fr = [];
  let n = 0;
  const badChunks = [];
  for await (const ch of stream) {
    n++;
    if (!(ch.object === 'text_completion' && ch.id.startsWith('cmpl-'))) badChunks.push(ch);
    for (const x of ch.choices) { text += x.text; fr.push(x.finish_reason); }
  }
  check(badChunks.length === 0, 'completions stream: every chunk object text_completion, id cmpl-...', badChunks);
  check(n >= 2, 'completions stream: several chunks', n);
  eq(text, ref.choices[0].text, 'completions stream: text = non-streamed');
  check(fr.slice(0, -1).every((f) => f === null) && fr[fr.length - 1] === 'length',
    'completions stream: finish_reason null until the last, then length', fr);
  // include_usage
  const s2 = await c.completions.create({ model: MODEL, prompt: G2.text, max_tokens: 20, temperature: 0, stream: true,
    stream_options: { include_usage: true } });
  let usage = null; let lastChoices = null; let t2 = '';
  for await (const ch of s2) {
    if (ch.usage) { usage = ch.usage; lastChoices = ch.choices; }
    for (const x of ch.choices) t2 += x.text;
  }
  eq(U(usage), U(ref.usage), 'completions stream include_usage: usage = non-stream usage');
  eq(lastChoices, [], 'completions stream include_usage: the usage chunk has choices []');
  eq(t2, ref.choices[0].text, 'completions stream include_usage: text');
}

const MSGS = [{ role: 'system', content: 'Answer as the prophets.' }, { role: 'user', content: 'Who is the LORD?' }];

async function tChat(c) {
  const off = offline([{ messages: MSGS, max_tokens: 12, temperature: 0 }], ['--chat-template', 'llama2'])[0];
  const r = await c.chat.completions.create({ model: MODEL, messages: MSGS, max_tokens: 12, temperature: 0 });
  fieldsOk(r, 'chat.completion', 'chatcmpl-', 'chat');
  eq(r.choices[0].message.role, 'assistant', 'chat: role assistant');
  eq(r.choices[0].message.content, off.text, 'chat: content = offline runner (llama2 template)');
  eq(r.usage.prompt_tokens, off.usage.prompt_tokens, 'chat: prompt_tokens = offline runner');
  check(['length', 'stop'].includes(r.choices[0].finish_reason), 'chat: finish_reason', r.choices[0].finish_reason);
  usageOk(r.usage, 'chat');
  const stream = await c.chat.completions.create({ model: MODEL, messages: MSGS, max_tokens: 12, temperature: 0,
    stream: true, stream_options: { include_usage: true } });
  const chunks = [];
  for await (const ch of stream) chunks.push(ch);
  const withChoices = chunks.filter((ch) => ch.choices.length);
  check(chunks.every((ch) => ch.object === 'chat.completion.chunk' && ch.id.startsWith('chatcmpl-')),
    'chat stream: chunk object and id', chunks[0]);
  eq(withChoices[0] && withChoices[0].choices[0].delta, { role: 'assistant', content: '' }, 'chat stream: first delta');
  eq(withChoices.map((ch) => ch.choices[0].delta.content || '').join(''), r.choices[0].message.content,
    'chat stream: content = non-streamed');
  const fr = withChoices.map((ch) => ch.choices[0].finish_reason);
  check(fr.slice(0, -1).every((f) => f === null) && fr[fr.length - 1] === r.choices[0].finish_reason,
    'chat stream: finish_reason on the last chunk only', fr);
  const last = chunks[chunks.length - 1];
  eq(last && last.choices, [], 'chat stream include_usage: last chunk choices []');
  eq(U(last && last.usage), U(r.usage), 'chat stream include_usage: usage = non-stream usage');
  check(withChoices.every((ch) => ch.usage === null), 'chat stream include_usage: other chunks usage null',
    withChoices[0] && withChoices[0].usage);
}

async function tStop(c) {
  const full = (await c.completions.create({ model: MODEL, prompt: G3.text, max_tokens: 16, temperature: 0 })).choices[0].text;
  check(full === ' ' + G3.greedy_text, 'stop: reference = HF greedy text', full);
  const stop = 'soul';
  const r = await c.completions.create({ model: MODEL, prompt: G3.text, max_tokens: 16, temperature: 0, stop });
  eq(r.choices[0].text, full.slice(0, full.indexOf(stop)), `stop '${stop}': text before it`);
  eq(r.choices[0].finish_reason, 'stop', 'stop: finish_reason stop');
  const ch = await c.chat.completions.create({ model: MODEL, messages: MSGS, max_tokens: 12, temperature: 0 });
  const words = ch.choices[0].message.content.split(/\s+/).filter((w) => /^[A-Za-z]{3,}$/.test(w));
  if (check(words.length >= 2, 'chat stop: a word to stop at', ch.choices[0].message.content)) {
    const w = words[1];
    const content = ch.choices[0].message.content;
    const r2 = await c.chat.completions.create({ model: MODEL, messages: MSGS, max_tokens: 12, temperature: 0, stop: [w] });
    eq(r2.choices[0].message.content, content.slice(0, content.indexOf(w)), `chat stop ['${w}']: content before it`);
    eq(r2.choices[0].finish_reason, 'stop', 'chat stop: finish_reason stop');
  }
}

async function tSeed(c) {
  const req = (seed) => c.completions.create({ model: MODEL, prompt: G1.text, max_tokens: 12, temperature: 0.8, seed });
  const a = (await req(42)).choices[0].text;
  const b = (await req(42)).choices[0].text;
  eq(a, b, 'seed 42, temperature 0.8 twice -> same text');
  // several other seeds: all five giving the very text of seed 42 would be a seed that is ignored
  const others = new Set();
  for (const s of [1, 2, 3, 4]) others.add((await req(s)).choices[0].text);
  others.add(a);
  check(others.size >= 2, 'different seeds -> different texts (5 seeds, not all equal)', [...others]);
  const chatReq = (seed) => c.chat.completions.create({ model: MODEL, messages: MSGS, max_tokens: 10, temperature: 0.8, seed });
  const ca = (await chatReq(7)).choices[0].message.content;
  const cb = (await chatReq(7)).choices[0].message.content;
  eq(ca, cb, 'chat seed 7 twice -> same content');
}

async function tN(c) {
  const r = await c.completions.create({ model: MODEL, prompt: G2.text, max_tokens: 12, temperature: 0.8, seed: 3, n: 3 });
  eq(r.choices.map((x) => x.index).sort(), [0, 1, 2], 'n=3: choices with indices 0..2');
  check(r.choices.every((x) => typeof x.text === 'string' && x.finish_reason), 'n=3: every choice has text and finish_reason', r.choices);
  usageOk(r.usage, 'n=3');
  const g = await c.completions.create({ model: MODEL, prompt: G2.text, max_tokens: 12, temperature: 0, n: 2 });
  eq(g.choices.length, 2, 'greedy n=2: two choices');
  const off = offline([{ prompt: G2.text, max_tokens: 12, temperature: 0 }])[0].text;
  check(g.choices.length === 2 && g.choices[0].text === off && g.choices[1].text === off,
    'greedy n=2: identical texts (= the offline runner)', g.choices.map((x) => x.text));
  const ch = await c.chat.completions.create({ model: MODEL, messages: MSGS, max_tokens: 8, temperature: 0, n: 2 });
  eq(ch.choices.map((x) => x.index).sort(), [0, 1], 'chat n=2: indices 0, 1');
  check(ch.choices.length === 2 && ch.choices[0].message.content === ch.choices[1].message.content,
    'chat greedy n=2: identical', ch.choices.map((x) => x.message.content));
}

async function tLogprobs(c) {
  const r = await c.completions.create({ model: MODEL, prompt: G1.text, max_tokens: 8, temperature: 0, logprobs: 2 });
  const lp = r.choices[0].logprobs;
  if (check(lp && lp.tokens.length === 8 && lp.token_logprobs.length === 8 && lp.top_logprobs.length === 8,
    'completions logprobs=2: 8 tokens', lp)) {
    eq(lp.tokens.join(''), r.choices[0].text, 'completions logprobs: tokens join to the text');
    check(lp.token_logprobs.every((x) => typeof x === 'number' && x <= 0), 'completions logprobs: numbers <= 0', lp.token_logprobs);
    check(lp.top_logprobs.every((t, k) => {
      const v = Object.values(t);
      return v.length === 2 && v.every((x) => x <= 0) && Math.abs(Math.max(...v) - lp.token_logprobs[k]) < 1e-6 &&
        Math.abs(t[lp.tokens[k]] - lp.token_logprobs[k]) < 1e-6;
    }), 'completions logprobs: 2 alternatives, the greedy token the top one', lp.top_logprobs);
  }
  for (const [temp, name] of [[0, 'greedy'], [1.0, 'sampled']]) {
    const ch = await c.chat.completions.create({ model: MODEL, messages: MSGS, max_tokens: 10, temperature: temp, seed: 11,
      logprobs: true, top_logprobs: 4 });
    const content = ch.choices[0].logprobs && ch.choices[0].logprobs.content;
    if (!check(Array.isArray(content) && content.length === ch.usage.completion_tokens,
      `chat logprobs (${name}): one entry per token`, ch.choices[0].logprobs)) continue;
    eq(content.map((e) => e.token).join(''), ch.choices[0].message.content, `chat logprobs (${name}): tokens join to the content`);
    let ok = true; let sorted = true; let consistent = true;
    for (const e of content) {
      ok &&= typeof e.logprob === 'number' && e.logprob <= 0 && e.top_logprobs.length === 4 &&
        e.top_logprobs.every((t) => t.logprob <= 0 && Array.isArray(t.bytes));
      for (let i = 1; i < e.top_logprobs.length; i++) sorted &&= e.top_logprobs[i - 1].logprob >= e.top_logprobs[i].logprob;
      const same = e.top_logprobs.find((t) => t.token === e.token);
      // the chosen token: in the top list with the same logprob, or below the whole list
      consistent &&= same ? Math.abs(same.logprob - e.logprob) < 1e-6 : e.logprob <= e.top_logprobs[e.top_logprobs.length - 1].logprob;
      if (temp === 0) consistent &&= e.top_logprobs[0].token === e.token;
    }
    check(ok, `chat logprobs (${name}): numbers <= 0, 4 top_logprobs with bytes`, content[0]);
    check(sorted, `chat logprobs (${name}): top_logprobs sorted descending`, content.map((e) => e.top_logprobs.map((t) => t.logprob)));
    check(consistent, `chat logprobs (${name}): the chosen token's logprob agrees with top_logprobs`, content);
  }
}

async function tMaxTokens(c) {
  const r = await c.completions.create({ model: MODEL, prompt: G2.text, max_tokens: 20, temperature: 0.7, seed: 1, ignore_eos: true });
  eq(r.choices[0].finish_reason, 'length', 'max_tokens 20 + ignore_eos: finish_reason length');
  eq(r.usage.completion_tokens, 20, 'max_tokens 20 + ignore_eos: completion_tokens 20');
  usageOk(r.usage, 'max_tokens');
  const ch = await c.chat.completions.create({ model: MODEL, messages: MSGS, max_tokens: 9, temperature: 0.7, seed: 1, ignore_eos: true });
  eq(ch.choices[0].finish_reason, 'length', 'chat max_tokens 9 + ignore_eos: length');
  eq(ch.usage.completion_tokens, 9, 'chat max_tokens 9 + ignore_eos: completion_tokens 9');
  const ch2 = await c.chat.completions.create({ model: MODEL, messages: MSGS, max_completion_tokens: 5, temperature: 0, ignore_eos: true });
  eq(ch2.usage.completion_tokens, 5, 'chat max_completion_tokens 5: completion_tokens 5');
}

async function tErrors(c) {
  try {
    await c.completions.create({ model: MODEL, prompt: G1.text, max_tokens: 4, temperature: -1 });
    check(false, 'temperature -1 -> BadRequestError', 'no error');
  } catch (e) {
    check(e instanceof OpenAI.BadRequestError && e.status === 400, 'temperature -1 -> BadRequestError 400', `${e.constructor.name} ${e.status}`);
    eq(e.param, 'temperature', 'BadRequestError param temperature');
    eq(e.type, 'invalid_request_error', 'BadRequestError type invalid_request_error');
  }
  try {
    await c.chat.completions.create({ model: MODEL, messages: [{ role: 'wizard', content: 'hi' }], max_tokens: 2 });
    check(false, 'chat role wizard -> BadRequestError', 'no error');
  } catch (e) {
    check(e instanceof OpenAI.BadRequestError, 'chat role wizard -> BadRequestError', `${e.constructor.name} ${e.status}`);
  }
  try {
    await c.completions.create({ model: 'gpt-3.5-turbo-instruct', prompt: 'x', max_tokens: 2 });
    check(false, 'unknown model -> NotFoundError', 'no error');
  } catch (e) {
    check(e instanceof OpenAI.NotFoundError && e.status === 404 && e.code === 'model_not_found',
      'unknown model -> NotFoundError 404 model_not_found', `${e.constructor.name} ${e.status} ${e.code}`);
  }
}

async function tAbort(c) {
  // leave a stream after two chunks (the SDK aborts the request); the server serves the next one
  const stream = await c.completions.create({ model: MODEL, prompt: G1.text, max_tokens: 400, temperature: 0, ignore_eos: true, stream: true });
  let n = 0;
  for await (const ch of stream) { void ch; if (++n === 2) break; }
  const r = await c.completions.create({ model: MODEL, prompt: G1.text, max_tokens: 16, temperature: 0 });
  eq(r.choices[0].text, ' ' + G1.greedy_text, 'after an abandoned stream: the next request is served (HF text)');
}

async function tApiKey() {
  const s = await startServer('sdk-apikey', ['--api-key', 'k-42']);
  try {
    try {
      await client(s, 'wrong').completions.create({ model: MODEL, prompt: 'x', max_tokens: 2 });
      check(false, 'wrong api key -> AuthenticationError', 'no error');
    } catch (e) {
      check(e instanceof OpenAI.AuthenticationError && e.status === 401, 'wrong api key -> AuthenticationError 401',
        `${e.constructor.name} ${e.status}`);
      eq(e.code, 'invalid_api_key', 'AuthenticationError code invalid_api_key');
    }
    try {
      const list = [];
      for await (const m of client(s, 'wrong').models.list()) list.push(m);
      check(false, 'wrong api key: models.list -> AuthenticationError', 'no error');
    } catch (e) {
      check(e instanceof OpenAI.AuthenticationError, 'wrong api key: models.list -> AuthenticationError', `${e.constructor.name}`);
    }
    const r = await client(s, 'k-42').completions.create({ model: MODEL, prompt: G1.text, max_tokens: 16, temperature: 0 });
    eq(r.choices[0].text, ' ' + G1.greedy_text, 'right api key: completion served');
  } finally {
    await stopServer(s);
  }
}

async function main() {
  if (!MODEL) { check(false, 'QSHARD_SERVE_MODEL set'); return; }
  let s;
  try {
    s = await startServer('sdk', ['--chat-template', 'llama2']);
  } catch (e) {
    check(false, 'sdk server starts', e.message);
    return;
  }
  const c = client(s);
  for (const [name, fn] of [['models', tModels], ['completions', tCompletions], ['completions stream', tCompletionsStream],
    ['chat', tChat], ['stop', tStop], ['seed', tSeed], ['n', tN], ['logprobs', tLogprobs], ['max_tokens', tMaxTokens],
    ['errors', tErrors], ['abort', tAbort]]) {
    const t0 = Date.now();
    await run(name, () => fn(c));
    console.log(`# ${name}: ${((Date.now() - t0) / 1000).toFixed(1)}s`);
  }
  await stopServer(s);
  await run('api key', tApiKey);
}

await main().catch((e) => check(false, 'openai_sdk.mjs', e.stack || String(e)));
if (failures.length) {
  console.log('# openai_sdk failures:');
  for (const f of failures) console.log('#   ' + f);
}
console.log(`# openai_sdk: ${passed} passed, ${failed} failed`);
for (const sv of servers) try { sv.proc.kill('SIGKILL'); } catch { /* gone */ }
process.exit(failed ? 1 : 0);
