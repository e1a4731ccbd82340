"""The server side users run: TorchServe configured, packaged, sized and controlled.

Read in the order a start runs (``python -m bert_serve_server start``, ``make serve``):

- ``control``: one TorchServe in its own state folder: its view (addresses, keys, pid, workers
  and their memory), its start, the wait until READY (its logs read on a failed start), its stop,
  and the command line over it (``start``, ``stop``, ``status``, ...);
- ``config``: config/config.properties read, overridden (ports, batch settings) and written; the
  one reader of its ``models=`` entry, and the entry that serves several models
  (``make serve MODELS=...``);
- ``archive``: a Hugging Face folder and handler/ packed as a .mar, with its reference profile,
  and the ``package`` command (``make package``);
- ``sizing``: workers, threads, ``batchSize``, the queue bound and the heap from the machine the
  server starts on, one plan with its reasons, with what ``BERT_SERVE_*`` variables and a saved
  plan state, and the image's step (``python -m bert_serve_server size``); from ``probe`` (the
  machine read, one worker measured in a child process) by ``rules`` (pure);
- ``ready``: the pod's probe, ready only when every worker of every model is READY
  (``python -m bert_serve_server ready``, deploy/k8s/deployment.yaml), and what ready, started
  and drained mean;
- ``layout``: the container / KServe layout of the model store and config;
- ``live_metrics``: the live summary of the handler's metrics (``make metrics``);
- ``environment``: the server's lock (requirements/server.lock) and torch build checks.

Nothing here imports the lab (``lab/``: benchmarks, chaos, soak, fuzz) or ``tests/``; the image
installs this package alone. Modules import only what their command needs: the image's sizing
step runs without ``handler/`` or an HTTP client.
"""
