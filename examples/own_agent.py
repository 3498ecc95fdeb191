#!/usr/bin/env python3
"""A team's own LangChain agent, with offpath added: the two lines marked ``# offpath``.

The agent is the team's: its model, its tools, its PostgreSQL checkpointer. offpath's
middleware compacts its threads off the request path: a worker summarizes the oldest
messages (reading the thread from this checkpointer by URL), and the middleware
applies the summary at a later model call, as the run's own state update. No model
call waits for a summary, and offpath never writes this agent's checkpoint itself.

Run it beside offpath's worker (same ``REDIS_URL`` and ``DATABASE_URL`` for offpath's
own tables, in the environment or ``.env``)::

    offpath worker &
    python examples/own_agent.py --db postgresql://postgres@127.0.0.1:5432/my_agent \\
        --thread inc-42 "why is checkout slow?"

With no LLM configured (``OPENAI_API_KEY`` / ``OPENAI_BASE_URL``) it uses offpath's
scripted demo model, whose answers say so.
"""

from __future__ import annotations

import argparse

from langchain.agents import create_agent
from langgraph.checkpoint.postgres import PostgresSaver

from offpath import OffPathCompaction  # offpath
from offpath.agent.sre_tools import SRE_TOOLS  # the team's own tools would go here
from offpath.config import get_settings


def model():
    """The team's model: any OpenAI-compatible endpoint, or the demo's scripted one."""
    settings = get_settings()
    if not settings.llm_configured:
        from offpath.agent.scripted import ScriptedChatModel

        return ScriptedChatModel()
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(model=settings.chat_model, base_url=settings.openai_base_url or None)


def ask(db_url: str, thread: str, questions: list[str]) -> None:
    with PostgresSaver.from_conn_string(db_url) as saver:
        saver.setup()
        agent = create_agent(
            model(),
            SRE_TOOLS,
            system_prompt="You are an SRE assistant. Investigate with the read-only tools.",
            checkpointer=saver,
            middleware=[OffPathCompaction(checkpointer_url=db_url)],  # offpath
        )
        for question in questions:
            result = agent.invoke(
                {"messages": [{"role": "user", "content": question}]},
                {"configurable": {"thread_id": thread}},
            )
            print(f"> {question}\n{result['messages'][-1].content}\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("questions", nargs="+", help="what to ask, one run each")
    parser.add_argument("--db", required=True, help="the agent's own PostgreSQL (a URL)")
    parser.add_argument("--thread", default="own-agent", help="the conversation's thread id")
    args = parser.parse_args()
    ask(args.db, args.thread, args.questions)


if __name__ == "__main__":
    main()
