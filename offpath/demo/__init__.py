"""The demo agent's parts: read-only SRE tools over fixture files (:mod:`.sre_tools`) and a
scripted chat model that replays fixed investigations with them (:mod:`.scripted`)."""
