"""The server side users run: TorchServe configured, packaged, sized and controlled.

Read in the order a start runs (``python -m bert_serve_server start``, ``make serve``):

- ``config``: config/config.properties read, overridden (ports, batch settings) and written;
- ``models``: several models on one server (``make serve MODELS=...``): names, versions, files;
- ``archive``, ``package``: a Hugging Face folder and handler/ packed as a .mar, and the
  ``package`` command (``make package``);
- ``sizing``: workers, threads, ``batchSize``, the queue bound and the heap from the machine
  the server starts on, one plan with its reasons; its stages: ``machine`` (the CPUs paid for,
  cores, memory), ``stated`` (``BERT_SERVE_*`` variables), ``plan`` (a saved plan), ``measure``
  (one worker measured in a child process), ``rules`` (pure), ``served`` (the models and their
  workers); ``size_cli``: the image's step, ``python -m bert_serve_server size``;
- ``control``: start one TorchServe in its own state folder, wait until READY, stop;
  ``server``: an instance's view (addresses, keys, pid, workers), ``start_log`` its logs read
  on a failed start, ``process_memory`` its processes' memory; ``ctl``: the command line over
  it (``start``, ``stop``, ``status``, ...);
- ``layout``: the container / KServe layout of the model store and config;
- ``ready``: the pod's probe, ready only when every worker of every model is READY
  (``python -m bert_serve_server ready``, deploy/k8s/deployment.yaml);
- ``metrics``: the live summary of the handler's metrics (``make metrics``);
- ``environment``: the server's lock (requirements/server.lock) and torch build checks.

Nothing here imports the lab (``lab/``: benchmarks, chaos, soak, fuzz) or ``tests/``; the image
installs this package alone. Modules import only what their command needs: the image's sizing
step runs without ``handler/`` or an HTTP client.
"""
