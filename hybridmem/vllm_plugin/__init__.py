"""hybridmem's vLLM plugin (entry point ``vllm.general_plugins: hybridmem``).

vLLM calls :func:`register` once in every process it starts (engine core included). It

* applies the CPU prefix-caching fix for Mamba2 hybrids (:mod:`.cpu_fix`);
* installs the organization-mode wrappers: the grid (:mod:`.org_geometry`, active only with
  ``HYBRIDMEM_ORG_GRID``) and state storage (:mod:`.org_state`, active only while a
  :class:`~.state_table.StateTable` is activated or the poison check is on);
* sizes the KV cache to an organization's block ids when the engine config carries
  ``additional_config["hybridmem"]`` (:func:`.org_settings.install_block_override`);
* when ``HYBRIDMEM_TRACE`` names a trace path, installs the tracing hooks (:mod:`.tracing`)
  and gives the engine core time to write END when a server stops (:mod:`.shutdown`). With the
  variable unset nothing is wrapped and the engine runs unmodified;
* registers hybridmem's counters with the Prometheus registry vLLM serves on ``/metrics``
  (:mod:`.org_metrics`; they appear once an organization-backed engine core reports).

Loading is idempotent, as vLLM requires. In-process drivers that start several engines call
:func:`hybridmem.vllm_plugin.tracing.install` themselves before a traced engine starts.
"""

from __future__ import annotations

import os

from hybridmem.names import ENV_TRACE
from hybridmem.vllm_plugin import cpu_fix, org_geometry, org_state

TRACE_ENV = ENV_TRACE


def register() -> None:
    cpu_fix.apply()
    org_geometry.install()
    org_state.install()
    from hybridmem.vllm_plugin import org_settings

    org_settings.install_block_override()  # acts only with additional_config["hybridmem"]
    if os.environ.get(TRACE_ENV):
        from hybridmem.vllm_plugin import shutdown, tracing

        tracing.install()
        shutdown.install()
    from hybridmem.vllm_plugin import org_metrics

    org_metrics.register_collector()
