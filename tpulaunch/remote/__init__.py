"""`tpulaunch run` and `tpulaunch rehearse`: a job run on its TPU VM and supervised from outside it.

The flow: `stage.py` puts what the VM needs under run.model_dir (content-addressed); `startup.py` writes the
startup script every host of the slice runs when it boots (`startup.sh`, the one template), which starts
`host.py` there (fetch the stage, run `tpulaunch train` with the host's role, keep its output per host
under model_dir); `controller.py` creates the TPU, follows the run from what it writes to model_dir and the
node's state, and recovers from infrastructure failures (`causes.py` says which are); `contention.py`
finds who else holds model_dir's lease before a VM is created (an earlier VM left training is stopped); `rehearsal.py` runs
all of it on this machine against the local Cloud TPU API, whose TPU VMs are local processes.
`layout.py` says where everything lives under model_dir; `tpulaunch/store/` reads and writes there (local or gs://).
"""
