// offpath web UI: live regions, the "compact now", "revert" and "delete" buttons. Plain JS,
// no build step.
//
// A page whose <body> has data-live="/ui/live/..." polls that URL every data-poll-ms
// milliseconds; the answer is {"regions": {name: html}} and each element with
// data-region="name" gets the new html when it changed. <details> that were open
// (by their data-key) stay open across a refresh.
"use strict";

(function () {
  const body = document.body;
  const live = body.dataset.live;
  const pollMs = Number(body.dataset.pollMs) || 2000;
  const uiHeader = body.dataset.uiHeader || "X-Offpath-UI";
  const status = document.getElementById("live-status");
  const last = {};
  let version = null; // the live answer's version: sent back as ?v=, unchanged -> no html

  function setStatus(text, ok) {
    if (!status) return;
    status.textContent = text;
    status.className = "live-status " + (ok ? "ok" : "bad");
  }

  function swap(region, html) {
    const open = new Set(
      Array.from(region.querySelectorAll("details[open][data-key]"), (d) => d.dataset.key)
    );
    region.innerHTML = html;
    region.querySelectorAll("details[data-key]").forEach((d) => {
      if (open.has(d.dataset.key)) d.open = true;
    });
  }

  async function poll() {
    if (document.hidden) return;
    try {
      let url = live;
      if (version) url += (live.includes("?") ? "&" : "?") + "v=" + encodeURIComponent(version);
      const r = await fetch(url, { credentials: "same-origin", cache: "no-store" });
      if (r.status === 401) {
        window.location = "/ui/login?next=" + encodeURIComponent(location.pathname + location.search);
        return;
      }
      if (!r.ok) {
        setStatus("refresh failed (" + r.status + ")", false);
        return;
      }
      const data = await r.json();
      version = data.version || null;
      for (const [name, html] of Object.entries(data.regions)) {
        const region = document.querySelector('[data-region="' + name + '"]');
        if (!region) continue;
        if (!(name in last)) {
          // first poll: the region holds the server's page html; compare both as the DOM
          // serializes them, so an unchanged region is not swapped (a swap replaces its
          // nodes under the reader, and under a script holding one of them)
          const parsed = document.createElement("template");
          parsed.innerHTML = html;
          last[name] = parsed.innerHTML === region.innerHTML ? html : region.innerHTML;
        }
        if (html !== last[name]) {
          swap(region, html);
          last[name] = html;
        }
      }
      setStatus("live · " + new Date().toLocaleTimeString(), true);
    } catch (e) {
      setStatus("offline", false);
    }
  }

  if (live) {
    // each poll swaps only the regions whose html changed since the last one
    poll();
    setInterval(poll, pollMs);
  }

  // a <select data-autosubmit> submits its form when changed (no inline handlers: CSP)
  document.querySelectorAll("select[data-autosubmit]").forEach((select) => {
    select.addEventListener("change", () => select.form.submit());
  });

  async function detailOf(r) {
    try {
      const detail = (await r.json()).detail;
      return typeof detail === "string" ? detail : JSON.stringify(detail);
    } catch (e) {
      return "";
    }
  }

  const remove = document.getElementById("delete-session");
  if (remove) {
    remove.addEventListener("click", async () => {
      const id = remove.dataset.session;
      if (!window.confirm("Delete session " + id + ", its archive and its rows?")) return;
      const out = document.getElementById("delete-result");
      remove.disabled = true;
      const r = await fetch("/sessions/" + encodeURIComponent(id), {
        method: "DELETE",
        credentials: "same-origin",
        headers: { [uiHeader]: "1" },
      });
      if (r.status === 204) {
        window.location = "/ui/sessions";
      } else {
        out.textContent = "not deleted (" + r.status + "): " + (await detailOf(r));
        remove.disabled = false;
      }
    });
  }

  // "Revert" on the latest compaction: its button is re-rendered by the live
  // region, so the click is caught on the document
  document.addEventListener("click", async (event) => {
    const revert = event.target.closest("button.revert");
    if (!revert) return;
    const job = revert.dataset.job;
    if (!window.confirm("Put the originals of compaction " + job.slice(0, 8) + " back in place of its summary?")) return;
    const out = document.getElementById("revert-result");
    revert.disabled = true;
    try {
      const r = await fetch(
        "/sessions/" + encodeURIComponent(revert.dataset.session) + "/compactions/" +
          encodeURIComponent(job) + "/revert",
        { method: "POST", credentials: "same-origin", headers: { [uiHeader]: "1" } }
      );
      if (r.ok) {
        const data = await r.json();
        out.textContent = "reverted " + job.slice(0, 8) + ": " + data.messages_restored +
          " messages and " + data.results_restored + " results put back";
      } else {
        out.textContent = "not reverted (" + r.status + "): " + (await detailOf(r));
        revert.disabled = false;
      }
    } catch (e) {
      out.textContent = "the API did not answer: " + e;
      revert.disabled = false;
    } finally {
      if (live) poll();
    }
  });

  // the session's compaction updates, live: GET /sessions/{id}/events,
  // server-sent events whose data is an ACP session/update ({sessionId, update: {sessionUpdate:
  // "compaction_update", compactionId, status, charsBefore, charsAfter, reason}})
  const feed = document.getElementById("compaction-events");
  if (feed && window.EventSource) {
    const source = new EventSource(feed.dataset.events);
    const fmt = (n) => (n == null ? "?" : Number(n).toLocaleString("en-US"));
    source.onmessage = (event) => {
      let update, at;
      try {
        const data = JSON.parse(event.data);
        update = data.update;
        at = data.at ? new Date(data.at) : new Date();
      } catch (e) {
        return;
      }
      const item = document.createElement("li");
      item.dataset.status = update.status;
      item.dataset.job = update.compactionId;
      let text = at.toLocaleTimeString() + " job " + String(update.compactionId).slice(0, 8) +
        " " + update.status.replace("_", " ");
      if (update.status === "completed") {
        text += ": " + fmt(update.charsBefore) + " → " + fmt(update.charsAfter) + " chars";
      } else if (update.charsBefore != null) {
        text += " (" + fmt(update.charsBefore) + " chars)";
      }
      if (update.reason) text += ": " + update.reason;
      item.textContent = text;
      // the job the "Compact now" button queued: its line says where the job is now
      const result = document.getElementById("compact-result");
      if (result && result.dataset.jobId === String(update.compactionId)) {
        result.textContent = text.slice(text.indexOf("job "));
        result.dataset.status = update.status;
      }
      feed.prepend(item);
      while (feed.children.length > 20) feed.lastElementChild.remove();
      if (live && update.status !== "in_progress") poll(); // the thread and jobs changed
    };
  }

  const button = document.getElementById("compact-now");
  if (button) {
    button.addEventListener("click", async () => {
      const out = document.getElementById("compact-result");
      button.disabled = true;
      out.textContent = "queueing...";
      try {
        const r = await fetch(
          "/sessions/" + encodeURIComponent(button.dataset.session) + "/compact",
          { method: "POST", credentials: "same-origin", headers: { [uiHeader]: "1" } }
        );
        let detail = "";
        let data = {};
        try {
          data = await r.json();
          detail = data.detail || "";
        } catch (e) {
          /* not JSON */
        }
        if (r.status === 202) {
          out.textContent = "job " + String(data.job_id).slice(0, 8) + " " + (data.status || "queued") +
            (data.kind === "own agent" ? ": " + data.detail : "");
          out.dataset.jobId = data.job_id;
          // its events may have come before this answer: the newest one says where it is
          const heard = feed && feed.querySelector('li[data-job="' + CSS.escape(String(data.job_id)) + '"]');
          if (heard) {
            out.textContent = heard.textContent.slice(heard.textContent.indexOf("job "));
            out.dataset.status = heard.dataset.status;
          }
        } else {
          out.textContent = "not queued (" + r.status + "): " + (typeof detail === "string" ? detail : JSON.stringify(detail));
        }
      } catch (e) {
        out.textContent = "the API did not answer: " + e;
      } finally {
        button.disabled = false;
        if (live) poll();
      }
    });
  }
})();
