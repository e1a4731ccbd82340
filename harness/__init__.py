"""The tools around the served model, for a checkout of this repository.

``scripts/`` are entry points; what they share lives here, typed and imported from one place:

- ``config``: config/config.properties read (its ``models=`` entry parsed once), overridden
  (free ports, batch settings) and written;
- ``server``: one TorchServe in its own state folder: start, wait, stop, keys, logs, and its
  workers (pids, kill one, wait for its replacement, memory in MB);
- ``load``: the one closed-loop load generator, with a record per request;
- ``corpus``: the labelled reviews and the deterministic mixed-length benchmark corpus;
- ``batchlog``: the handler's per-batch log lines, read over a window of time;
- ``measure``: "this config at these loads", the step bench and tune repeat;
- ``bench``, ``tune``: the benchmark's and the tuner's experiments;
- ``compare``: fp32 against a faster precision on a user's texts (speed, score changes, flips);
- ``inprocess``, ``peer``, ``reports``: the benchmark's in-process runs, its LitServe peer,
  and the JSON summaries and plots of bench and tune;
- ``chaos``: the chaos experiments, one module each (``chaos.kill_runs``: many worker kills,
  counting the requests nobody answers); ``soak``: the long mixed-traffic run watching memory
  and logs;
- ``metrics``: the live metrics summary;
- ``layout``: the container / KServe layout; ``archive``: .mar variants; ``training``: the
  default model's fine-tuning;
- ``image``, ``image_checks``: the image run as a user would (``make image-test``) and the
  request checks it makes, one function each;
- ``environment``: the server's lock (requirements/server.lock) and torch build checks.

This package is not part of the installable client (``bert_serve``, which never imports it):
it needs the server and dev extras (torch, aiohttp, psutil, matplotlib) and the repository's
files (config/, scripts/data/), so it runs from a checkout (``make install``), not from a wheel.
"""
