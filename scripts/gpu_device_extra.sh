# Source on the GPU host after .gpu-carry/device-setup.sh, from the project root:
#   . .gpu-carry/device-setup.sh && . scripts/gpu_device_extra.sh
# It unpacks LitServe's carried site (scripts/gpu_carry_extra.sh) into /tmp/site-litserve once
# per machine and puts it first on PYTHONPATH (its pydantic and pydantic-core must match).
if [ ! -d /tmp/site-litserve/litserve ]; then
  mkdir -p /tmp/site-litserve && tar -C /tmp/site-litserve -xJf .gpu-carry/litserve-site.tar.xz
fi
export PYTHONPATH=/tmp/site-litserve${PYTHONPATH:+:$PYTHONPATH}
python3 -c 'import litserve; print("litserve", litserve.__version__)'
