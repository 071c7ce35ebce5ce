#!/usr/bin/env python3
"""raw_http.py - qshard serve over plain HTTP (python3 stdlib only): every error case of
tests/serve's contract (status and the error JSON shape), the SSE framing, the request fields
that the OpenAI SDK does not reach, hostile clients (truncated requests, garbage, 1,000 idle
connections, a client vanishing mid-stream, bodies over the limit, a full queue), /tokenize,
/detokenize, /metrics, shutdown and loading. Run by test_serve.sh (environment: see srv.py).

References the server did not produce: HF transformers' token ids, greedy continuations and
logits of the KJV prompts (tests/data/models/INDEX.json, tests/data/golden/kjv-llama/), the
offline batch runner (`qshard run --prompts`), the offline tokenizer (`qshard tokenize`).
"""
import json
import os
import re
import resource
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import srv  # noqa: E402
import raw_http_opts  # noqa: E402
from rawlib import *  # noqa: E402,F401,F403
from srv import SLOW, Server, metric, sse_events, stop_checked  # noqa: E402

S = None                                    # the main server
OFF = {}                                    # offline runner results, by name
SYS_MSGS = [{"role": "system", "content": "Answer as the prophets."},
            {"role": "user", "content": "Who is the LORD?"}]
MULTI = [{"role": "user", "content": "Who made the heaven?"},
         {"role": "assistant", "content": "God made the heaven and the earth."},
         {"role": "user", "content": "And the sea?"}]
OFFLINE = {  # one `qshard run --prompts` for every offline reference of this file
    "chat_sys": {"messages": SYS_MSGS, "max_tokens": 12, "temperature": 0},
    "chat_multi": {"messages": MULTI, "max_tokens": 8, "temperature": 0},
    "chat_count": {"messages": [{"role": "user", "content": "Who is the LORD?"}], "max_tokens": 1,
                   "temperature": 0},
    "stop": {"prompt": G2["text"], "max_tokens": 16, "temperature": 0, "stop": "Behold"},
    "rep": {"prompt": G1["text"], "max_tokens": 24, "temperature": 0, "repetition_penalty": 1.3},
}


def t_health_models():
    st, js, raw, hd = S.get("/health")
    T.check(st == 200 and js == {"status": "ok"}, "GET /health -> 200 {\"status\":\"ok\"}",
            "%r %r" % (st, raw[:200]))
    T.check("application/json" in hd.get("content-type", ""), "/health Content-Type is JSON",
            hd.get("content-type"))
    T.eq(S.host, "127.0.0.1", "default --host is 127.0.0.1 (the listening line)")
    st, js, raw, _ = S.get("/v1/models")
    ok = st == 200 and isinstance(js, dict) and js.get("object") == "list" and \
        isinstance(js.get("data"), list) and len(js["data"]) == 1
    T.check(ok, "GET /v1/models -> list of one model", "%r %r" % (st, raw[:300]))
    if ok:
        m = js["data"][0]
        T.eq(m.get("id"), srv.MODEL, "/v1/models id = MODEL_DIR as given on the command line")
        T.eq(m.get("object"), "model", "/v1/models object 'model'")
        T.eq(m.get("owned_by"), "qshard", "/v1/models owned_by 'qshard'")
        T.check(isinstance(m.get("created"), int) and abs(m["created"] - time.time()) < 86400 * 365,
                "/v1/models created is a unix time", m.get("created"))
        T.eq(m.get("max_model_len"), CTX, "/v1/models max_model_len = the model's context (512)")


def t_completion_golden():
    """Greedy 16-token continuations of the three HF reference prompts: text and token ids as
    HF transformers' generate() made them (INDEX.json), fields as the contract says."""
    for g in (G1, G2, G3):
        st, js, raw, hd = S.post("/v1/completions", {"model": srv.MODEL, "prompt": g["text"],
                                                     "max_tokens": 16, "temperature": 0})
        if not ok_json("completion %r -> 200" % g["name"], st, js, raw):
            continue
        T.check(re.match(r"^cmpl-\S+$", str(js.get("id"))), "completion id 'cmpl-...'", js.get("id"))
        T.eq(js.get("object"), "text_completion", "completion object")
        T.check(isinstance(js.get("created"), int) and abs(js["created"] - time.time()) < 600,
                "completion created = now (unix s)", js.get("created"))
        T.eq(js.get("model"), srv.MODEL, "completion model = served name")
        ch = js.get("choices") or [{}]
        T.eq(len(js.get("choices") or []), 1, "one choice")
        T.eq(ch[0].get("index"), 0, "choice index 0")
        T.check("logprobs" in ch[0] and ch[0]["logprobs"] is None, "logprobs null when not asked",
                ch[0].get("logprobs", "absent"))
        T.eq(ch[0].get("text"), " " + g["greedy_text"], "greedy text = HF generate() %s" % g["name"])
        T.eq(ch[0].get("finish_reason"), "length", "finish_reason length at max_tokens")
        u = js.get("usage") or {}
        T.eq({k: u.get(k) for k in ("prompt_tokens", "completion_tokens", "total_tokens")},
             {"prompt_tokens": len(g["ids"]), "completion_tokens": 16,
              "total_tokens": len(g["ids"]) + 16}, "usage %s" % g["name"])
    T.check("application/json" in hd.get("content-type", ""), "completion Content-Type JSON",
            hd.get("content-type"))


def t_log_line():
    """One stderr line per finished request, with its counts."""
    n0 = len(S.log_text().splitlines())
    st, js, raw, _ = S.post("/v1/completions", cmpl(max_tokens=5, ignore_eos=True))
    ok_json("completion for the log line", st, js, raw)
    rx = re.compile(r"^qshard serve: \S+ POST /v1/completions 200 prompt=%d completion=5 "
                    r"ttft=\d+(\.\d+)?ms total=\d+(\.\d+)?ms finish=length\s*$" % len(G1["ids"]))
    m = S.wait_log(rx, 5 * SLOW, start_line=n0)
    T.check(m is not None, "stderr request line 'qshard serve: <id> POST /v1/completions 200 "
            "prompt=6 completion=5 ttft=..ms total=..ms finish=length'",
            "log tail:\n" + S.log_tail(5))
    n0 = len(S.log_text().splitlines())
    st, js, raw, _ = S.post("/v1/completions", cmpl(temperature=-1))
    m = S.wait_log(re.compile(r"^qshard serve: \S+ POST /v1/completions 400 "), 5 * SLOW, start_line=n0)
    T.check(m is not None, "stderr request line for a refused request (status 400)",
            "log tail:\n" + S.log_tail(5))


def t_malformed():
    good_c = json.dumps(cmpl(max_tokens=1)).encode()
    good_ch = json.dumps(chat_body(max_tokens=1)).encode()
    for name, bc, bch in [("malformed JSON (cut short)", good_c[:-1], good_ch[:-1]),
                          ("malformed JSON (trailing garbage)", good_c + b" x", good_ch + b" x"),
                          ("malformed JSON (two objects)", good_c + good_c, good_ch + good_ch),
                          ("malformed JSON (single quotes)", b"{'prompt': 'a'}", b"{'messages': []}"),
                          ("not JSON at all", b"prompt=hello", b"messages=hello"),
                          ("empty body", b"", b"")]:
        st, hd, data = S.request("POST", "/v1/completions", raw_body=bc,
                                 headers={"Content-Type": "application/json"})
        err_check("completions: %s -> 400" % name, st, jparse(data), 400)
        st, hd, data = S.request("POST", "/v1/chat/completions", raw_body=bch,
                                 headers={"Content-Type": "application/json"})
        err_check("chat: %s -> 400" % name, st, jparse(data), 400)
    for v in ([1, 2], "str", 42, None):
        st, js, _, _ = S.post("/v1/completions", v)
        err_check("completions: JSON %s, not an object -> 400" % type(v).__name__, st, js, 400)
        st, js, _, _ = S.post("/v1/chat/completions", v)
        err_check("chat: JSON %s, not an object -> 400" % type(v).__name__, st, js, 400)


WRONG_TYPES = [
    ("model", 5), ("prompt", 5), ("prompt", {"a": 1}), ("prompt", [1.5]), ("prompt", [[1, "x"]]),
    ("prompt", [True]), ("prompt", ["a", 3]), ("max_tokens", "16"), ("max_tokens", 1.5),
    ("temperature", "hot"), ("top_p", "x"), ("top_k", "x"), ("top_k", 1.5), ("min_p", []),
    ("repetition_penalty", "x"), ("frequency_penalty", "x"), ("presence_penalty", "x"),
    ("stop", 5), ("stop", [1]), ("seed", "x"), ("seed", 1.5), ("n", "2"), ("n", 1.5),
    ("stream", "yes"), ("stream_options", "x"), ("logprobs", "x"), ("logprobs", 1.5),
    ("logprobs", True), ("echo", "x"), ("ignore_eos", "x"), ("skip_special_tokens", "x"),
]


OUT_OF_RANGE = [
    ("temperature", -1), ("top_p", 0), ("top_p", 2), ("top_p", -0.5), ("top_k", -2),
    ("min_p", -0.1), ("min_p", 1.5), ("repetition_penalty", 0), ("repetition_penalty", -1),
    ("frequency_penalty", 3), ("frequency_penalty", -2.5), ("presence_penalty", 3),
    ("presence_penalty", -3), ("n", 0), ("n", 129), ("n", -1), ("max_tokens", -1),
    ("logprobs", 21), ("logprobs", -1), ("stop", ["s%d" % i for i in range(17)]),
]


IN_RANGE = [  # the edges that must be accepted
    ("temperature", 0), ("top_p", 1), ("top_k", -1), ("min_p", 0), ("min_p", 1),
    ("presence_penalty", 2), ("presence_penalty", -2), ("frequency_penalty", 2),
    ("frequency_penalty", -2), ("logprobs", 20), ("logprobs", 0), ("n", 3),
    ("stop", ["s%d" % i for i in range(16)]), ("stop", "zzz"), ("repetition_penalty", 1.3),
    ("seed", 0),
]


def t_field_errors_completions():
    for f, v in WRONG_TYPES:
        st, js, _, _ = S.post("/v1/completions", cmpl(**{f: v}))
        err_check("completions: %s=%s (wrong type) -> 400 param %r" % (f, json.dumps(v), f),
                  st, js, 400, param=f)
    st, js, _, _ = S.post("/v1/completions", cmpl(stream=True, stream_options={"include_usage": "x"}))
    err_check("completions: stream_options.include_usage=\"x\" -> 400", st, js, 400,
              params=("stream_options", "stream_options.include_usage", "include_usage"))
    for f, v in OUT_OF_RANGE:
        st, js, _, _ = S.post("/v1/completions", cmpl(**{f: v}))
        err_check("completions: %s=%s (out of range) -> 400 param %r" % (f, json.dumps(v)[:40], f),
                  st, js, 400, param=f)
    b = cmpl()
    del b["prompt"]
    st, js, _, _ = S.post("/v1/completions", b)
    err_check("completions: no prompt -> 400 param 'prompt'", st, js, 400, param="prompt")
    for f, v in IN_RANGE:
        st, js, raw, _ = S.post("/v1/completions", cmpl(max_tokens=1, **{f: v}))
        ok_json("completions: %s=%s (in range) -> 200" % (f, json.dumps(v)[:40]), st, js, raw)


def t_field_errors_chat():
    base = {"messages": [{"role": "user", "content": "Who is the LORD?"}], "max_tokens": 4,
            "temperature": 0}

    def chat(**kw):
        b = dict(base)
        b.update(kw)
        return b
    for f, v in [("temperature", "x"), ("max_tokens", "4"),
                 ("logprobs", "yes"), ("logprobs", 1), ("top_logprobs", "x"), ("n", "1"),
                 ("stop", 3), ("seed", "x"), ("stream", "no"), ("model", 1)]:
        st, js, _, _ = S.post("/v1/chat/completions", chat(**{f: v}))
        err_check("chat: %s=%s (wrong type) -> 400 param %r" % (f, json.dumps(v), f), st, js, 400,
                  param=f)
    for f, v in [("temperature", -1), ("top_p", 0), ("n", 0), ("max_tokens", -1),
                 ("presence_penalty", 3), ("frequency_penalty", -3)]:
        st, js, _, _ = S.post("/v1/chat/completions", chat(**{f: v}))
        err_check("chat: %s=%s (out of range) -> 400 param %r" % (f, v, f), st, js, 400, param=f)
    for v in ("4", 2.5, -1, 0):
        b = chat()
        del b["max_tokens"]
        b["max_completion_tokens"] = v
        st, js, _, _ = S.post("/v1/chat/completions", b)
        err_check("chat: max_completion_tokens=%s -> 400 param 'max_completion_tokens'" % json.dumps(v),
                  st, js, 400, param="max_completion_tokens")
    st, js, _, _ = S.post("/v1/chat/completions", chat(max_completion_tokens="4"))
    err_check("chat: max_completion_tokens=\"4\" (wrong type) next to max_tokens -> 400", st, js, 400,
              param="max_completion_tokens")
    for tl in (21, -1):
        st, js, _, _ = S.post("/v1/chat/completions", chat(logprobs=True, top_logprobs=tl))
        err_check("chat: top_logprobs=%d -> 400 param 'top_logprobs'" % tl, st, js, 400,
                  param="top_logprobs")
    st, js, raw, _ = S.post("/v1/chat/completions", chat(logprobs=True, top_logprobs=20))
    ok_json("chat: logprobs true, top_logprobs=20 -> 200", st, js, raw)
    msgs_params = lambda p: p is not None and p.startswith("messages")  # noqa: E731
    for name, m in [("messages missing", None), ("messages a string", "hi"),
                    ("messages []", []), ("a message not an object", [5]),
                    ("role 'wizard'", [{"role": "wizard", "content": "hi"}]),
                    ("role a number", [{"role": 5, "content": "hi"}]),
                    ("no role", [{"content": "hi"}]),
                    ("content a number", [{"role": "user", "content": 5}]),
                    ("no content", [{"role": "user"}])]:
        b = chat()
        if m is None:
            del b["messages"]
        else:
            b["messages"] = m
        st, js, _, _ = S.post("/v1/chat/completions", b)
        good = err_check("chat: %s -> 400" % name, st, js, 400)
        if good:
            T.check(msgs_params(js["error"]["param"]), "chat: %s: param names 'messages'" % name,
                    js["error"]["param"])


def t_prompt_errors():
    for name, p in [("empty string", ""), ("empty list", []), ("list with an empty string", [""]),
                    ("empty token list", [[]])]:
        st, js, _, _ = S.post("/v1/completions", cmpl(prompt=p))
        err_check("completions: empty prompt (%s) -> 400 param 'prompt'" % name, st, js, 400,
                  param="prompt")
    for p in ([1, VOCAB], [1, -1], [[1, 300], [1, VOCAB + 1000]], [1, 2 ** 40]):
        st, js, _, _ = S.post("/v1/completions", cmpl(prompt=p))
        err_check("completions: token id outside the vocabulary %s -> 400" % json.dumps(p)[:40],
                  st, js, 400, param="prompt")
    st, js, raw, _ = S.post("/v1/completions", cmpl(prompt=[1, VOCAB - 1]))
    ok_json("completions: token id vocab-1 -> 200", st, js, raw)
    st, js, _, _ = S.post("/v1/completions", cmpl(echo=True, logprobs=1))
    err_check("completions: echo with logprobs -> 400", st, js, 400, params=("echo", "logprobs"))
    st, js, _, _ = S.post("/v1/completions", cmpl(prompt=[1] + [261] * 600, max_tokens=1))
    err_check("completions: prompt (601 tokens) over the 512 context -> 400 "
              "context_length_exceeded", st, js, 400, code="context_length_exceeded")
    st, js, _, _ = S.post("/v1/completions", cmpl(max_tokens=CTX))
    err_check("completions: prompt + max_tokens 512 over the context -> 400 "
              "context_length_exceeded", st, js, 400, code="context_length_exceeded")


def t_not_found_method():
    st, js, _, _ = S.post("/v1/completions", cmpl(model="no-such-model"))
    err_check("completions: unknown model -> 404 model_not_found", st, js, 404, code="model_not_found")
    st, js, _, _ = S.post("/v1/chat/completions", {"model": "gpt-4", "messages": [
        {"role": "user", "content": "hi"}], "max_tokens": 2})
    err_check("chat: unknown model -> 404 model_not_found", st, js, 404, code="model_not_found")
    for m, p in [("GET", "/nope"), ("POST", "/v1/nope"), ("GET", "/v1"), ("GET", "/v2/models"),
                 ("GET", "/v1/models/extra/x")]:
        st, hd, data = S.request(m, p)
        err_check("%s %s -> 404 not_found" % (m, p), st, jparse(data), 404, code="not_found")
    for m, p in [("GET", "/v1/completions"), ("GET", "/v1/chat/completions"),
                 ("DELETE", "/v1/completions"), ("PUT", "/v1/chat/completions"),
                 ("GET", "/tokenize"), ("GET", "/detokenize")]:
        st, hd, data = S.request(m, p)
        err_check("%s %s -> 405 method_not_allowed" % (m, p), st, jparse(data), 405,
                  etype=None, code="method_not_allowed")


def t_stream_completions():
    ref = S.post("/v1/completions", cmpl(max_tokens=12))[1]
    st, hd, raw = S.stream("/v1/completions", cmpl(max_tokens=12, stream=True))
    T.eq(st, 200, "completions stream -> 200")
    T.check(hd.get("content-type", "").startswith("text/event-stream"),
            "stream Content-Type text/event-stream", hd.get("content-type"))
    ev = sse_events(raw)
    if not T.check(ev is not None and len(ev) >= 2, "SSE framing: 'data: <json>\\n\\n' events",
                   raw[:400]):
        return
    T.eq(ev[-1], "[DONE]", "stream ends with data: [DONE]")
    chunks = [json.loads(e) for e in ev[:-1]]
    T.check(all(c.get("object") == "text_completion" for c in chunks), "chunks object text_completion",
            [c.get("object") for c in chunks][:5])
    T.check(len({c.get("id") for c in chunks}) == 1 and str(chunks[0].get("id")).startswith("cmpl-"),
            "one id 'cmpl-...' in every chunk", [c.get("id") for c in chunks][:3])
    T.check(all(len(c.get("choices", [])) == 1 and c["choices"][0].get("index") == 0 for c in chunks),
            "every chunk one choice, index 0", chunks[:2])
    fr = [c["choices"][0].get("finish_reason") for c in chunks]
    T.check(all(f is None for f in fr[:-1]) and fr[-1] == "length",
            "finish_reason null until the last chunk, then 'length'", fr)
    text = "".join(c["choices"][0].get("text", "") for c in chunks)
    T.eq(text, ref["choices"][0]["text"], "streamed text = non-streamed text (greedy)")
    T.check(not any(c.get("usage") for c in chunks), "no usage without stream_options", chunks[-1])
    # include_usage
    st, hd, raw = S.stream("/v1/completions", cmpl(max_tokens=12, stream=True,
                                                   stream_options={"include_usage": True}))
    ev = sse_events(raw) or ["x"]
    ok = T.check(ev[-1] == "[DONE]" and len(ev) >= 3, "include_usage stream well formed", raw[:300])
    if ok:
        chunks = [json.loads(e) for e in ev[:-1]]
        last = chunks[-1]
        T.check(last.get("choices") == [] and usage3(last.get("usage")) == usage3(ref["usage"]),
                "include_usage: last chunk choices [] and usage = non-stream usage",
                "%r vs %r" % (last, ref["usage"]))
        T.check(all("usage" in c and c["usage"] is None for c in chunks[:-1]),
                "include_usage: other chunks have usage null", chunks[0])
        T.eq("".join(c["choices"][0]["text"] for c in chunks[:-1]), ref["choices"][0]["text"],
             "include_usage: text unchanged")
    # n = 2 streamed: each choice finishes exactly once
    st, hd, raw = S.stream("/v1/completions", cmpl(max_tokens=6, stream=True, n=2))
    ev = sse_events(raw) or ["x"]
    if T.check(ev[-1] == "[DONE]", "n=2 stream well formed", raw[:300]):
        chunks = [json.loads(e) for e in ev[:-1]]
        per = {0: "", 1: ""}
        fin = {0: 0, 1: 0}
        for c in chunks:
            for ch in c["choices"]:
                per[ch["index"]] += ch.get("text", "")
                fin[ch["index"]] += ch.get("finish_reason") is not None
        T.check(fin == {0: 1, 1: 1}, "n=2 stream: each choice one finish_reason", fin)
        T.check(per[0] == per[1] == S.post("/v1/completions", cmpl(max_tokens=6))[1]["choices"][0]["text"],
                "n=2 greedy stream: both choices = the single greedy text", per)
    # two prompts streamed: index = prompt_index
    st, hd, raw = S.stream("/v1/completions", cmpl(prompt=[G1["text"], G2["text"]], max_tokens=16,
                                                   stream=True))
    ev = sse_events(raw) or ["x"]
    if T.check(ev[-1] == "[DONE]", "two prompts stream well formed", raw[:300]):
        per = {}
        for e in ev[:-1]:
            for ch in json.loads(e)["choices"]:
                per[ch["index"]] = per.get(ch["index"], "") + ch.get("text", "")
        T.eq(per, {0: " " + G1["greedy_text"], 1: " " + G2["greedy_text"]},
             "two prompts streamed: choice 0 and 1 = the HF greedy texts")
    # chat n=2 streamed: each choice starts with its role delta and finishes once
    st, hd, raw = S.stream("/v1/chat/completions", chat_body(max_tokens=5, n=2, stream=True))
    ev = sse_events(raw) or ["x"]
    if T.check(ev[-1] == "[DONE]", "chat n=2 stream well formed", raw[:300]):
        first, fin = {}, {0: 0, 1: 0}
        for e in ev[:-1]:
            for ch in json.loads(e)["choices"]:
                first.setdefault(ch["index"], ch.get("delta"))
                fin[ch["index"]] += ch.get("finish_reason") is not None
        T.eq(first, {0: {"role": "assistant", "content": ""}, 1: {"role": "assistant", "content": ""}},
             "chat n=2 stream: the first delta of each choice is the role")
        T.eq(fin, {0: 1, 1: 1}, "chat n=2 stream: one finish_reason per choice")


def t_chat():
    off = OFF["chat_sys"]
    b = chat_body(max_tokens=12)
    b["messages"].insert(0, {"role": "system", "content": "Answer as the prophets."})
    st, js, raw, _ = S.post("/v1/chat/completions", b)
    if not ok_json("chat -> 200", st, js, raw):
        return
    T.check(str(js.get("id")).startswith("chatcmpl-"), "chat id 'chatcmpl-...'", js.get("id"))
    T.eq(js.get("object"), "chat.completion", "chat object")
    ch = (js.get("choices") or [{}])[0]
    T.eq(ch.get("message", {}).get("role"), "assistant", "chat message role assistant")
    T.eq(ch.get("message", {}).get("content"), off["text"],
         "chat content = offline runner (llama2 template, system + user)")
    T.eq(js.get("usage", {}).get("prompt_tokens"), off["usage"]["prompt_tokens"],
         "chat prompt_tokens = offline runner's")
    T.check("logprobs" in ch and ch["logprobs"] is None, "chat logprobs null when not asked", ch)
    # multi-turn with an assistant message
    b2 = chat_body(max_tokens=8)
    b2["messages"] = MULTI
    off2 = OFF["chat_multi"]
    st, js, raw, _ = S.post("/v1/chat/completions", b2)
    if ok_json("chat multi-turn -> 200", st, js, raw):
        T.eq(js["choices"][0]["message"]["content"], off2["text"], "chat multi-turn = offline runner")
    # max_completion_tokens works as max_tokens
    b3 = chat_body(ignore_eos=True)
    del b3["max_tokens"]
    b3["max_completion_tokens"] = 7
    st, js, raw, _ = S.post("/v1/chat/completions", b3)
    if ok_json("chat max_completion_tokens -> 200", st, js, raw):
        T.eq(js["usage"]["completion_tokens"], 7, "chat max_completion_tokens 7 -> 7 tokens")
        T.eq(js["choices"][0]["finish_reason"], "length", "chat max_completion_tokens -> length")
    # streamed chat
    ref = S.post("/v1/chat/completions", chat_body())[1]
    st, hd, raw = S.stream("/v1/chat/completions", chat_body(stream=True))
    ev = sse_events(raw) or ["x"]
    if not T.check(st == 200 and ev[-1] == "[DONE]", "chat stream well formed", raw[:300]):
        return
    chunks = [json.loads(e) for e in ev[:-1]]
    T.check(all(c.get("object") == "chat.completion.chunk" for c in chunks),
            "chat chunks object chat.completion.chunk", chunks[0])
    T.check(str(chunks[0].get("id")).startswith("chatcmpl-") and len({c["id"] for c in chunks}) == 1,
            "chat chunks one id 'chatcmpl-...'", chunks[0].get("id"))
    T.eq(chunks[0]["choices"][0].get("delta"), {"role": "assistant", "content": ""},
         "first chat chunk delta {role: assistant, content: ''}")
    fr = [c["choices"][0].get("finish_reason") for c in chunks]
    T.check(all(f is None for f in fr[:-1]) and fr[-1] in ("length", "stop"),
            "chat finish_reason only on the last chunk", fr)
    T.eq("".join(c["choices"][0]["delta"].get("content", "") for c in chunks),
         ref["choices"][0]["message"]["content"], "chat streamed content = non-streamed")


def t_prompt_lists():
    single = {}
    for p in (G1["text"], G2["text"]):
        single[p] = S.post("/v1/completions", cmpl(prompt=p, max_tokens=8))[1]["choices"][0]["text"]
    st, js, raw, _ = S.post("/v1/completions", cmpl(prompt=[G1["text"], G2["text"]], n=2,
                                                    max_tokens=8, ignore_eos=True))
    if ok_json("two prompts x n=2 -> 200", st, js, raw):
        ch = sorted(js["choices"], key=lambda c: c["index"])
        T.eq([c["index"] for c in ch], [0, 1, 2, 3], "two prompts x n=2: indices 0..3")
        T.eq([c["text"] for c in ch], [single[G1["text"]]] * 2 + [single[G2["text"]]] * 2,
             "choice index = prompt_index * n + i (greedy texts of each prompt)")
        u = js["usage"]
        T.check(u["completion_tokens"] == 32 and u["total_tokens"] == u["prompt_tokens"] + 32,
                "two prompts x n=2 usage: 32 completion tokens, total = prompt + completion", u)
    st, js, raw, _ = S.post("/v1/completions", cmpl(prompt=G1["ids"], max_tokens=8))
    if ok_json("prompt as a token list -> 200", st, js, raw):
        T.eq(js["choices"][0]["text"], single[G1["text"]], "token-list prompt (HF ids) = text prompt")
        T.eq(js["usage"]["prompt_tokens"], len(G1["ids"]), "token-list prompt_tokens")
    st, js, raw, _ = S.post("/v1/completions", cmpl(prompt=[G1["ids"], G2["ids"]], max_tokens=8))
    if ok_json("prompt as a list of token lists -> 200", st, js, raw):
        ch = sorted(js["choices"], key=lambda c: c["index"])
        T.eq([c["text"] for c in ch], [single[G1["text"]], single[G2["text"]]],
             "list of token lists = the text prompts")


def t_stop_echo_defaults():
    """stop against HF's greedy text of text_2 (" Thus saith the Lord GOD; Behold, I will ...")."""
    ref = " " + G2["greedy_text"]
    stop = "Behold"
    want = ref[:ref.find(stop)]
    st, js, raw, _ = S.post("/v1/completions", cmpl(prompt=G2["text"], max_tokens=16, stop=stop))
    if ok_json("stop string -> 200", st, js, raw):
        T.eq(js["choices"][0]["text"], want, "stop %r: text up to the stop, without it (HF text)" % stop)
        T.eq(js["choices"][0]["finish_reason"], "stop", "stop string -> finish_reason stop")
        T.check(js["usage"]["completion_tokens"] < 16, "stop: generation ended there", js["usage"])
    T.eq(OFF["stop"]["text"], want, "stop: the offline runner agrees")
    st, js, raw, _ = S.post("/v1/completions", cmpl(prompt=G2["text"], max_tokens=16,
                                                    stop=["qqqq", stop, "zzzz"]))
    if ok_json("stop list -> 200", st, js, raw):
        T.eq(js["choices"][0]["text"], want, "stop list: the matching entry stops")
    st, js, raw, _ = S.post("/v1/completions", cmpl(prompt=G2["text"], max_tokens=16,
                                                    stop=["Lord", "saith"]))
    if ok_json("stop list, two matches -> 200", st, js, raw):
        T.eq(js["choices"][0]["text"], ref[:ref.find("saith")], "stop list: the earliest match wins")
    st, hd, raw = S.stream("/v1/completions", cmpl(prompt=G2["text"], max_tokens=16, stop=stop,
                                                   stream=True))
    ev = sse_events(raw) or ["x"]
    if T.check(ev[-1] == "[DONE]", "stop streamed well formed", raw[:200]):
        ch = [json.loads(e)["choices"][0] for e in ev[:-1]]
        T.eq("".join(c["text"] for c in ch), want, "stop streamed: the stop string never sent")
        T.eq(ch[-1]["finish_reason"], "stop", "stop streamed: finish_reason stop")
    st, js, raw, _ = S.post("/v1/completions", cmpl(prompt=G2["text"], max_tokens=16, stop="qqqq"))
    if ok_json("stop not matched -> 200", st, js, raw):
        T.eq(js["choices"][0]["text"], ref, "stop not matched: the whole HF text")
        T.eq(js["choices"][0]["finish_reason"], "length", "stop not matched: finish_reason length")
    # echo
    st, js, raw, _ = S.post("/v1/completions", cmpl(prompt=G1["text"], max_tokens=16, echo=True))
    if ok_json("echo -> 200", st, js, raw):
        T.eq(js["choices"][0]["text"], G1["text"] + " " + G1["greedy_text"],
             "echo: text = prompt + completion")
    # default max_tokens 16
    b = cmpl(ignore_eos=True)
    del b["max_tokens"]
    st, js, raw, _ = S.post("/v1/completions", b)
    if ok_json("no max_tokens -> 200", st, js, raw):
        T.eq(js["usage"]["completion_tokens"], 16, "completions default max_tokens 16")


def t_seed():
    b = cmpl(prompt=G3["text"], max_tokens=12, temperature=0.8, seed=1234)
    a1 = S.post("/v1/completions", b)[1]["choices"][0]["text"]
    a2 = S.post("/v1/completions", b)[1]["choices"][0]["text"]
    T.eq(a1, a2, "same seed twice -> same text")
    st, js, raw, _ = S.post("/v1/completions", dict(b, n=3))
    b1235 = S.post("/v1/completions", dict(b, seed=1235))[1]["choices"][0]["text"]
    b1236 = S.post("/v1/completions", dict(b, seed=1236))[1]["choices"][0]["text"]
    if ok_json("seed n=3 -> 200", st, js, raw):
        ch = sorted(js["choices"], key=lambda c: c["index"])
        T.eq([c["text"] for c in ch], [a1, b1235, b1236],
             "choice i uses seed + i (n=3, seed 1234 = seeds 1234, 1235, 1236 alone)")
    T.check(len({a1, b1235, b1236}) >= 2, "three seeds do not all give one text", (a1, b1235, b1236))


def t_sampling():
    """Sampling fields that reduce to greedy exactly (top_k 1, min_p 1, a tiny top_p: only the
    most likely token is left, whatever the seed), repetition_penalty against the offline
    runner, and frequency/presence penalties that change a repetitive greedy text."""
    greedy = " " + G1["greedy_text"]
    for name, kw in [("top_k=1", {"top_k": 1}), ("min_p=1", {"min_p": 1}),
                     ("top_p=1e-6", {"top_p": 1e-6})]:
        st, js, raw, _ = S.post("/v1/completions", cmpl(max_tokens=16, temperature=1.0, seed=5, **kw))
        if ok_json("sampling %s -> 200" % name, st, js, raw):
            T.eq(js["choices"][0]["text"], greedy, "temperature 1 + %s = the HF greedy text" % name)
    st, js, raw, _ = S.post("/v1/completions", cmpl(max_tokens=24, repetition_penalty=1.3))
    if ok_json("repetition_penalty 1.3 -> 200", st, js, raw):
        T.eq(js["choices"][0]["text"], OFF["rep"]["text"], "greedy + repetition_penalty 1.3 = offline runner")
    plain = S.post("/v1/completions", cmpl(max_tokens=24))[1]["choices"][0]["text"]
    for f in ("frequency_penalty", "presence_penalty"):
        st, js, raw, _ = S.post("/v1/completions", cmpl(max_tokens=24, **{f: 2}))
        if ok_json("%s 2 -> 200" % f, st, js, raw):
            T.check(js["choices"][0]["text"] != plain, "greedy + %s 2 differs from the repetitive greedy text" % f,
                    (js["choices"][0]["text"], plain))


def t_logprobs():
    """logprobs of the greedy continuation of text_1 against HF transformers' logits."""
    shape, lg = srv.read_npy_f32(os.path.join(srv.REPO, "tests/data", GOLD["golden_dir"], "text_1.seq_logits.npy"))
    V = shape[1]
    n_prompt = len(G1["ids"])
    st, js, raw, _ = S.post("/v1/completions", cmpl(max_tokens=8, logprobs=3))
    if not ok_json("completions logprobs=3 -> 200", st, js, raw):
        return
    ch = js["choices"][0]
    lp = ch.get("logprobs")
    ok = isinstance(lp, dict) and all(isinstance(lp.get(k), list) and len(lp[k]) == 8
                                      for k in ("tokens", "token_logprobs", "top_logprobs", "text_offset"))
    if not T.check(ok, "logprobs: tokens/token_logprobs/top_logprobs/text_offset, 8 each", lp):
        return
    T.eq("".join(lp["tokens"]), ch["text"], "logprobs tokens join to the text")
    off = [lp["text_offset"][0] + sum(len(t) for t in lp["tokens"][:k]) for k in range(8)]
    T.eq(lp["text_offset"], off, "text_offset advances by each token's length")
    worst, top_ok, sorted_ok = 0.0, True, True
    for k in range(8):
        hf = srv.log_softmax(lg[(n_prompt - 1 + k) * V:(n_prompt + k) * V])
        worst = max(worst, abs(lp["token_logprobs"][k] - hf[G1["greedy_ids"][k]]))
        top = lp["top_logprobs"][k]
        hf_top = sorted(hf, reverse=True)[:3]
        vals = sorted(top.values(), reverse=True)
        top_ok &= len(top) == 3 and all(abs(a - b) < 2e-3 for a, b in zip(vals, hf_top))
        top_ok &= abs(top.get(lp["tokens"][k], 1.0) - lp["token_logprobs"][k]) < 1e-6
        sorted_ok &= all(v <= 0 for v in top.values()) and lp["token_logprobs"][k] <= 0
    T.check(worst < 2e-3, "token_logprobs = HF log_softmax of the logits (|d| < 2e-3)", worst)
    T.check(top_ok, "top_logprobs: 3 entries = HF's top 3, the (greedy) chosen token among them",
            lp["top_logprobs"][:2])
    T.check(sorted_ok, "logprobs <= 0", lp["token_logprobs"])
    # chat logprobs
    st, js, raw, _ = S.post("/v1/chat/completions", chat_body(max_tokens=6, logprobs=True, top_logprobs=2))
    if ok_json("chat logprobs -> 200", st, js, raw):
        c = (js["choices"][0].get("logprobs") or {}).get("content")
        ok = isinstance(c, list) and len(c) == js["usage"]["completion_tokens"]
        if T.check(ok, "chat logprobs.content one entry per token", js["choices"][0].get("logprobs")):
            T.eq("".join(e["token"] for e in c), js["choices"][0]["message"]["content"],
                 "chat logprobs tokens join to the content")
            T.check(all(list(e["token"].encode()) == e["bytes"] for e in c),
                    "chat logprobs bytes = UTF-8 of the token", c[0])
            T.check(all(len(e["top_logprobs"]) == 2 and
                        e["top_logprobs"][0]["logprob"] >= e["top_logprobs"][1]["logprob"] and
                        abs(e["top_logprobs"][0]["logprob"] - e["logprob"]) < 1e-6 and
                        e["top_logprobs"][0]["token"] == e["token"] for e in c),
                    "chat top_logprobs: 2, sorted, greedy token first", c[0])


def t_tokenize():
    for g in (G1, G2, G3):
        st, js, raw, _ = S.post("/tokenize", {"prompt": g["text"]})
        if ok_json("/tokenize %s -> 200" % g["name"], st, js, raw):
            T.eq(js.get("tokens"), g["ids"], "/tokenize = HF tokenizer ids (%s)" % g["name"])
            T.eq(js.get("count"), len(g["ids"]), "/tokenize count")
            T.eq(js.get("max_model_len"), CTX, "/tokenize max_model_len")
    st, js, raw, _ = S.post("/tokenize", {"prompt": G1["text"], "add_special_tokens": False,
                                          "model": srv.MODEL})
    if ok_json("/tokenize add_special_tokens false -> 200", st, js, raw):
        T.eq(js.get("tokens"), G1["ids"][1:], "/tokenize add_special_tokens=false: no BOS")
    off = subprocess.run([srv.QSHARD, "tokenize", srv.MODEL, "--text", SENTENCE, "--no-bos", "--ids"],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=60 * SLOW)
    off_ids = json.loads(off.stdout.decode()) if off.returncode == 0 else None
    st, js, raw, _ = S.post("/tokenize", {"prompt": SENTENCE, "add_special_tokens": False})
    if ok_json("/tokenize sentence -> 200", st, js, raw):
        T.eq(js["tokens"], off_ids, "/tokenize = offline `qshard tokenize --no-bos`")
        T.eq(js["count"], len(js["tokens"]), "/tokenize count = len(tokens)")
        st2, js2, raw2, _ = S.post("/detokenize", {"tokens": js["tokens"]})
        if ok_json("/detokenize -> 200", st2, js2, raw2):
            T.eq(js2.get("prompt"), SENTENCE, "detokenize(tokenize(text)) == text")
    msgs = [{"role": "user", "content": "Who is the LORD?"}]
    st, js, raw, _ = S.post("/tokenize", {"messages": msgs})
    ch = S.post("/v1/chat/completions", {"messages": msgs, "max_tokens": 1, "temperature": 0})[1]
    if ok_json("/tokenize messages -> 200", st, js, raw):
        T.eq(js.get("count"), ch["usage"]["prompt_tokens"], "/tokenize messages count = chat prompt_tokens")
        T.eq(js.get("count"), OFF["chat_count"]["usage"]["prompt_tokens"],
             "/tokenize messages count = offline runner's chat prompt")
    st, js, _, _ = S.post("/tokenize", {"prompt": 5})
    err_check("/tokenize prompt=5 -> 400", st, js, 400, param="prompt")
    st, js, _, _ = S.post("/tokenize", {"prompt": "x", "model": "nope"})
    err_check("/tokenize unknown model -> 404", st, js, 404, code="model_not_found")
    st, js, _, _ = S.post("/detokenize", {"tokens": [1, VOCAB]})
    err_check("/detokenize id outside the vocabulary -> 400", st, js, 400, param="tokens")
    st, js, _, _ = S.post("/detokenize", {"tokens": "x"})
    err_check("/detokenize tokens not a list -> 400", st, js, 400, param="tokens")
    st, hd, data = S.request("POST", "/tokenize", raw_body=b"{nope")
    err_check("/tokenize malformed JSON -> 400", st, jparse(data), 400)


NAMED = {"qshard:num_requests_running": "gauge", "qshard:num_requests_waiting": "gauge",
         "qshard:request_success_total": "counter", "qshard:prompt_tokens_total": "counter",
         "qshard:generation_tokens_total": "counter", "qshard:kv_cache_blocks_used": "gauge",
         "qshard:kv_cache_blocks_total": "gauge",
         "qshard:time_to_first_token_seconds": "histogram",
         "qshard:time_per_output_token_seconds": "histogram"}


def t_metrics():
    st, hd, data = S.request("GET", "/metrics")
    T.eq(st, 200, "GET /metrics -> 200")
    T.check(hd.get("content-type", "").startswith("text/plain"), "/metrics Content-Type text/plain",
            hd.get("content-type"))
    try:
        m0 = srv.parse_prometheus(data.decode())
    except ValueError as e:
        T.check(False, "/metrics parses as Prometheus text", str(e))
        return
    T.check(True, "/metrics parses as Prometheus text")
    for name, typ in NAMED.items():
        t = m0["types"].get(name) or m0["types"].get(name[:-len("_total")] if name.endswith("_total") else name)
        T.eq(t, typ, "/metrics # TYPE %s %s" % (name, typ))
        if typ != "histogram":
            T.check(msum(m0, name) is not None, "/metrics has a %s sample" % name)
    for h in ("qshard:time_to_first_token_seconds", "qshard:time_per_output_token_seconds"):
        b = [(lb.get("le"), v) for n, lb, v in m0["samples"] if n == h + "_bucket"]
        les = [float(x) if x != "+Inf" else float("inf") for x, _ in b]
        ok = len(b) >= 2 and b[-1][0] == "+Inf" and les == sorted(les) and \
            all(b[i][1] <= b[i + 1][1] for i in range(len(b) - 1)) and \
            metric(m0, h + "_count") == b[-1][1] and (metric(m0, h + "_sum") or 0) >= 0
        T.check(ok, "%s: buckets le ascending to +Inf, cumulative, +Inf = _count, _sum" % h,
                (b, metric(m0, h + "_count")))
    T.eq(msum(m0, "qshard:num_requests_running"), 0, "idle: num_requests_running 0")
    T.eq(msum(m0, "qshard:num_requests_waiting"), 0, "idle: num_requests_waiting 0")
    tot, used = msum(m0, "qshard:kv_cache_blocks_total"), msum(m0, "qshard:kv_cache_blocks_used")
    T.check(tot and tot > 0 and used is not None and 0 <= used <= tot, "kv blocks 0 <= used <= total > 0",
            (used, tot))
    js = S.post("/v1/completions", cmpl(max_tokens=8, ignore_eos=True))[1]
    # the counters may be updated just after the response went out: wait (briefly) for them
    t0 = time.monotonic()
    while True:
        m1 = S.metrics()
        d = lambda n: (msum(m1, n) or 0) - (msum(m0, n) or 0)  # noqa: E731
        if d("qshard:request_success_total") >= 1 and d("qshard:generation_tokens_total") >= 8 or \
                time.monotonic() - t0 > 2 * SLOW:
            break
        time.sleep(0.05)
    print("# metrics: counters settled %.3fs after the response" % (time.monotonic() - t0))
    T.eq(d("qshard:request_success_total"), 1, "request_success_total +1 after a request")
    T.eq(d("qshard:prompt_tokens_total"), js["usage"]["prompt_tokens"], "prompt_tokens_total += prompt_tokens")
    T.eq(d("qshard:generation_tokens_total"), 8, "generation_tokens_total += completion_tokens")
    T.eq(metric(m1, "qshard:time_to_first_token_seconds_count") -
         metric(m0, "qshard:time_to_first_token_seconds_count"), 1, "ttft histogram _count +1")
    T.check(metric(m1, "qshard:time_per_output_token_seconds_count") >
            metric(m0, "qshard:time_per_output_token_seconds_count"), "tpot histogram _count grows")
    T.check(metric(m1, "qshard:time_to_first_token_seconds_sum") >
            metric(m0, "qshard:time_to_first_token_seconds_sum"), "ttft histogram _sum grows")


def one_4xx_response(rep):
    """'' when rep is empty (closed) or exactly one well-formed HTTP 4xx response (status line,
    headers, a body of Content-Length bytes and nothing after it); else why not."""
    if rep == b"":
        return ""
    head, sep, body = rep.partition(b"\r\n\r\n")
    if not sep or not re.match(rb"HTTP/1\.[01] 4\d\d ", head):
        return "not an HTTP 4xx response"
    m = re.search(rb"(?im)^content-length:\s*(\d+)\s*$", head)
    if m and int(m.group(1)) != len(body):
        return "Content-Length %s but %d bytes follow" % (m.group(1).decode(), len(body))
    if body.startswith(b"HTTP/1."):
        return "a second status line where the body should be"
    return ""


def t_hostile_requests():
    raw_send(S, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
             b"Content-Length: 1000\r\n\r\n{\"prompt\":", read=False)
    still_serving("truncated body (Content-Length 1000, 10 bytes, close)", S)
    rep = raw_send(S, b"GARBAGE \x00\xff\xfe nonsense\r\n\r\n", timeout=5 * SLOW)
    why = one_4xx_response(rep)
    T.check(not why, "garbage request line -> one 4xx response or closed", "%s: %r" % (why, rep[:300]))
    still_serving("garbage request line", S)
    raw_send(S, b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + os.urandom(200), read=False)
    still_serving("a TLS ClientHello", S)
    raw_send(S, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n", read=False)
    still_serving("headers cut short", S)
    # A Content-Length that is not a number never reaches qshard's handler: libmicrohttpd
    # 0.9.75 (Debian 12) answers it itself, with a 400 whose status line and headers it writes
    # twice (the same with a minimal MHD program in every threading mode; docs/SERVE.md,
    # "Known limits"). What is checked: the first thing on the wire is a 400, the connection
    # is closed, and the server goes on serving.
    for name, cl in [("negative", b"-5"), ("not a number", b"abc")]:
        rep = raw_send(S, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + cl +
                       b"\r\n\r\n{}", timeout=5 * SLOW)
        T.check(rep.startswith(b"HTTP/1.1 400 "), "%s Content-Length -> 400 first" % name,
                rep[:300])
        still_serving("%s Content-Length" % name, S)


def wait_running(server, want_zero, bound):
    """Poll num_requests_running until it is 0 (want_zero) or >= 1; its last value."""
    t0 = time.monotonic()
    while True:
        running = msum(server.metrics(), "qshard:num_requests_running")
        if (running == 0) == want_zero or time.monotonic() - t0 > bound:
            return running
        time.sleep(0.05)


def t_disconnect_mid_stream():
    for mode in ("mid-stream", "non-streaming"):
        m0 = S.metrics()
        s = sse_socket(S, cmpl(max_tokens=LONG, ignore_eos=True, stream=mode == "mid-stream"))
        if mode == "mid-stream":
            buf, n, eof = read_events(s, 2)
            T.check(n >= 2 and not eof and b" 200 " in buf.split(b"\r\n", 1)[0],
                    "long stream: two SSE events arrive", buf[:200])
        running = wait_running(S, False, 10 * SLOW)
        T.check((running or 0) >= 1, "num_requests_running >= 1 during a long %s request" % mode, running)
        s.close()
        still_serving("a client vanished (%s)" % mode, S)
        running = wait_running(S, True, 10 * SLOW)
        T.check(running == 0, "num_requests_running back to 0 after the client left (%s, %gs)"
                % (mode, 10 * SLOW), running)
        m1 = S.metrics()
        gen = msum(m1, "qshard:generation_tokens_total") - msum(m0, "qshard:generation_tokens_total")
        T.check(gen < LONG, "the vanished client's request was cancelled (%s): %d tokens generated, not "
                "all %d" % (mode, gen, LONG), gen)


def t_main():
    global S
    names = list(OFFLINE)
    for k, r in zip(names, srv.offline_run([OFFLINE[k] for k in names], ["--chat-template", "llama2"])):
        OFF[k] = r
    S = Server("main", ["--chat-template", "llama2"])
    for fn in (t_health_models, t_completion_golden, t_log_line, t_malformed,
               t_field_errors_completions, t_field_errors_chat, t_prompt_errors,
               t_not_found_method, t_stream_completions, t_chat, t_prompt_lists,
               t_stop_echo_defaults, t_seed, t_sampling, t_logprobs, t_tokenize, t_metrics,
               t_hostile_requests, t_disconnect_mid_stream):
        T.run(fn)
    stop_checked(T, S, name="main server: SIGTERM -> exit 0")


def main():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 4096 if hard == resource.RLIM_INFINITY else min(hard, 4096)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    T.check(resource.getrlimit(resource.RLIMIT_NOFILE)[0] >= 2100,
            "RLIMIT_NOFILE raised for 1000 connections", resource.getrlimit(resource.RLIMIT_NOFILE))
    only = sys.argv[1:]
    o = raw_http_opts
    for fn in (t_main, o.t_ctx64, o.t_api_key, o.t_body_limit, o.t_queue_full,
               o.t_idle_connections, o.t_sigterm_cancel, o.t_loading, o.t_tp2,
               o.t_slow_stream_timeout, o.t_body_edges):
        if only and fn.__name__ not in only:
            continue
        T.run(fn)
    return T.summary()


if __name__ == "__main__":
    sys.exit(main())
