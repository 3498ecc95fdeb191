"""A small OpenAI-compatible chat-completions server for tests and benchmarks.

Real HTTP, so the real ``ChatOpenAI`` client runs against it. Behaviour is set
at run time with ``POST /_control`` (``{"mode": ..., "delay_s": ..., "times": n}``):

* ``ok``: answer after ``delay_s`` (a summary for summarization prompts, a chat
  reply otherwise);
* ``500`` / ``429`` (with ``Retry-After: 1``) / ``empty`` (no text) /
  ``malformed`` (a body that is not JSON) / ``timeout`` (answers after 30 s);
* ``times``: the mode holds for that many requests, then back to ``ok``;
* ``tool_calls``: chat requests that offer tools are answered with tool calls (the first
  of ``get_logs``) numbered per response, as Ollama and some vLLM models do: every
  response's first call is ``get_logs:0``; three rounds per turn, then a text answer
  (summarization requests are answered as in ``ok``). A turn is named by its request's
  text, found in the last user message or, once a compaction moved the request into the
  summary, inside it (:meth:`StubState.tool_round`);
* ``hold``: ``true`` makes every request wait (up to 60 s) until ``hold`` is set
  back to ``false``, so a test can act while a summary is being written without
  guessing how long it takes;
* ``context_openai`` / ``context_anthropic`` / ``context_llamacpp``: a context-length refusal
  (HTTP 400) in OpenAI's shape (``context_length_exceeded``, "This model's maximum context
  length is ..."), Anthropic's ("prompt is too long: N tokens > M maximum") or llama.cpp's
  server's (``exceed_context_size_error``, which ``langchain_openai`` does not convert), the
  model's window said to be 70% of the request's tokens (its chars / 4); with ``times`` once,
  without it always;
* ``held``: the requests the mode applies to (those holding ``needle``) wait (up to 60 s)
  until ``state.release`` is set, the others are answered at once: one session's chat run
  stays in flight while the rest of the stack is served;
* ``summary_chars``: summaries are padded to about this many chars with findings that name
  nothing specific (an LLM-shaped summary of 3-5k chars, as a real model writes them;
  0: the short stub summary);
* ``names_nothing``: ``true`` makes the summary's **Investigating** line generic too (by
  default it quotes the first request of the prompt), so the summary names nothing at all.

``GET /_requests`` lists the requests' messages; ``DELETE /_requests`` clears them.
Run alone: ``python tests/stub_llm.py --port 8999 --delay 1``.
"""

from __future__ import annotations

import argparse
import json
import re
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

SUMMARY = (
    "**Investigating:** {first}\n**Key findings:**\n- {n} messages summarized by the stub LLM\n"
    "**Ruled out:** nothing ruled out yet\n**Current state:** stub summary"
)


#: The bodies of a context-length refusal, by mode: (tokens sent, the window) -> body.
REFUSALS = {
    "context_openai": lambda sent, limit: {
        "error": {
            "message": f"This model's maximum context length is {limit} tokens. However, "
            f"your messages resulted in {sent} tokens. Please reduce the length of the messages.",
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded",
        }
    },
    "context_anthropic": lambda sent, limit: {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": f"prompt is too long: {sent} tokens > {limit} maximum",
        },
    },
    "context_llamacpp": lambda sent, limit: {
        "error": {
            "code": 400,
            "message": f"request ({sent} tokens) exceeds the available context size "
            f"({limit} tokens), try increasing it",
            "type": "exceed_context_size_error",
            "n_prompt_tokens": sent,
            "n_ctx": limit,
        }
    },
}


class StubState:
    def __init__(self, delay_s: float = 0.0) -> None:
        self.lock = threading.Lock()
        self.mode = "ok"
        self.times: int | None = None
        #: the mode applies only to requests whose messages hold this text (None: to all);
        #: the others are answered ``ok`` and do not count against ``times``
        self.needle: str | None = None
        self.delay_s = delay_s
        self.requests: list[dict[str, Any]] = []
        self.calls = 0
        self.gate = threading.Event()  # set: answer; clear: hold every request
        self.gate.set()
        self.release = threading.Event()  # set: the requests of mode "held" are answered
        self.release.set()
        self.summary_chars = 0
        self.names_nothing = False
        #: mode ``tool_calls``: tool-call rounds answered per turn, by the turn's request text
        self.rounds: dict[str, int] = {}

    def reset(self, requests: bool = True) -> None:
        """Answer at once, in mode ``ok``, with short summaries; ``requests``: forget those seen."""
        with self.lock:
            self.mode, self.times, self.needle, self.delay_s = "ok", None, None, 0.0
            self.summary_chars = 0
            self.names_nothing = False
            self.rounds.clear()
            if requests:
                self.requests.clear()
        self.gate.set()
        self.release.set()

    def tool_round(self, last_user: str, rounds: int = 3) -> bool:
        """Whether the turn whose request is ``last_user`` gets another tool-call round.

        ``last_user`` is the request itself, or a summary holding it verbatim (the turn's
        earlier rounds were compacted away with it): then the turn is the latest request
        seen that the summary holds. Counting by turn, not by the messages in the request,
        keeps ``rounds`` per turn whatever a compaction removed."""
        with self.lock:
            turn = last_user
            if last_user not in self.rounds:
                inside = [seen for seen in self.rounds if seen in last_user]
                turn = inside[-1] if inside else last_user
            done = self.rounds.setdefault(turn, 0)
            if done >= rounds:
                return False
            self.rounds[turn] = done + 1
            return True

    def next_mode(self, text: str = "") -> str:
        with self.lock:
            self.calls += 1
            if self.needle is not None and self.needle not in text:
                return "ok"  # another test's request (a stack still running a job)
            mode = self.mode
            if self.times is not None:
                self.times -= 1
                if self.times <= 0:
                    self.mode, self.times, self.needle = "ok", None, None
            return mode


class Handler(BaseHTTPRequestHandler):
    server: StubServer  # type: ignore[assignment]
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def setup(self) -> None:
        super().setup()
        # headers and body go out in two writes: without this, Nagle's algorithm holds the
        # body until the client's delayed ACK (~40 ms a request), as no real LLM server does
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _send(self, code: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def _json(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(length) or b"{}")

    def do_GET(self) -> None:
        if self.path == "/_requests":
            with self.server.state.lock:
                body = json.dumps(self.server.state.requests).encode()
            self._send(200, body)
        else:
            self._send(404, b'{"error": "not found"}')

    def do_DELETE(self) -> None:
        with self.server.state.lock:
            self.server.state.requests.clear()
            self.server.state.calls = 0
        self._send(200, b"{}")

    def do_POST(self) -> None:
        state = self.server.state
        if self.path == "/_control":
            body = self._json()
            with state.lock:
                state.mode = body.get("mode", "ok")
                state.times = body.get("times")
                if "delay_s" in body:
                    state.delay_s = float(body["delay_s"])
                if "hold" in body:
                    (state.gate.clear if body["hold"] else state.gate.set)()
                if "summary_chars" in body:
                    state.summary_chars = int(body["summary_chars"])
                if "names_nothing" in body:
                    state.names_nothing = bool(body["names_nothing"])
            self._send(200, b"{}")
            return
        if not self.path.endswith("/chat/completions"):
            self._send(404, b'{"error": "not found"}')
            return
        body = self._json()
        messages = body.get("messages", [])
        with state.lock:
            state.requests.append({"messages": messages, "model": body.get("model")})
            delay = state.delay_s
        mode = state.next_mode(json.dumps(messages))
        state.gate.wait(timeout=60)
        if mode == "held":
            state.release.wait(timeout=60)
        if mode == "500":
            self._send(
                500, b'{"error": {"message": "stub: internal error", "type": "server_error"}}'
            )
            return
        if mode == "429":
            self._send(
                429,
                b'{"error": {"message": "stub: rate limited", "type": "rate_limit"}}',
                {"Retry-After": "1"},
            )
            return
        if mode in REFUSALS:
            sent = len(json.dumps(messages)) // 4
            self._send(400, json.dumps(REFUSALS[mode](sent, sent * 7 // 10)).encode())
            return
        if mode == "malformed":
            self._send(200, b"this is not json")
            return
        time.sleep(30.0 if mode == "timeout" else delay)
        system = next((m.get("content", "") for m in messages if m.get("role") == "system"), "")
        if mode == "empty":
            text = ""
        elif isinstance(system, str) and system.startswith("You compact"):
            user = messages[-1].get("content", "") if messages else ""
            human = re.search(r"\n\[[0-9a-f]{16} human\]\n(.*)", user)
            first = human.group(1)[:120] if human else "stub"
            if state.names_nothing:
                first = "the request the user made"
            text = SUMMARY.format(first=first, n=len(re.findall(r"\n\n\[[0-9a-f]{16} ", user)))
            text = pad_summary(text, state.summary_chars)
        else:
            last = messages[-1].get("content", "") if messages else ""
            text = f"stub reply to: {str(last)[:80]}"
        calls = None
        if mode == "tool_calls" and body.get("tools") and not str(system).startswith("You compact"):
            users = [str(m.get("content", "")) for m in messages if m.get("role") == "user"]
            if state.tool_round(users[-1] if users else ""):
                text = ""
                calls = [
                    {
                        "id": "get_logs:0",  # per-response numbering: the same id every time
                        "type": "function",
                        "function": {
                            "name": "get_logs",
                            "arguments": json.dumps({"service": "checkout-api", "limit": 400}),
                        },
                    }
                ]
        reply = {
            "id": f"chatcmpl-stub-{state.calls}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", "stub"),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text, "tool_calls": calls}
                    if calls
                    else {"role": "assistant", "content": text},
                    "finish_reason": "stop",
                }
            ],
            "usage": {
                "prompt_tokens": len(json.dumps(messages)) // 4,
                "completion_tokens": len(text) // 4,
                "total_tokens": 0,
            },
        }
        self._send(200, json.dumps(reply).encode())


GENERIC_FINDINGS = (
    "the agent inspected the service's logs and saw errors around the incident window",
    "several components were checked and their state was compared with the baseline",
    "metrics showed elevated latency on the affected path during the reported period",
    "recent changes to the deployment were reviewed as a possible trigger",
    "resource usage of the workloads was examined for signs of pressure",
)


def pad_summary(text: str, chars: int) -> str:
    """``text`` (the stub's summary) with generic findings added under **Key findings**
    until it holds about ``chars`` chars: the length of a real model's summary, and none of
    its specifics."""
    if chars <= len(text):
        return text
    head, sep, rest = text.partition("**Ruled out:**")
    bullets, k = [], 0
    while len(head) + len(sep) + len(rest) + sum(len(b) + 1 for b in bullets) < chars:
        bullets.append(f"- {GENERIC_FINDINGS[k % len(GENERIC_FINDINGS)]} (point {k + 1})")
        k += 1
    return head + "\n".join(bullets) + "\n" + sep + rest


class StubServer(ThreadingHTTPServer):
    daemon_threads = True
    #: listen backlog: a worker's pool opens a connection per concurrent job at once (hundreds);
    #: socketserver's default of 5 drops the rest's SYNs, and each waits a 1 s retransmit
    request_queue_size = 1024

    def __init__(self, port: int = 0, delay_s: float = 0.0) -> None:
        super().__init__(("127.0.0.1", port), Handler)
        self.state = StubState(delay_s)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"

    def start(self) -> StubServer:
        threading.Thread(target=self.serve_forever, daemon=True).start()
        return self


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8999)
    parser.add_argument("--delay", type=float, default=0.0)
    args = parser.parse_args()
    server = StubServer(args.port, args.delay)
    print(f"stub LLM at {server.base_url}", flush=True)
    server.serve_forever()
