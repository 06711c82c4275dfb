"""Reading a master's ``/metrics`` the way Prometheus does, for the metrics tests."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from mooncake_py.testing import InProcessMaster


class Scrape:
    """One scrape of ``/metrics``, parsed with ``prometheus_client.parser``.

    Attributes:
        samples: every sample of the scrape.
        families: family name (as the parser names it: a counter without ``_total``) -> its
            type.
    """

    def __init__(self, master: InProcessMaster) -> None:
        port = master.metrics_port
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
            text = reply.read().decode()
        families = list(text_string_to_metric_families(text))
        self.samples: list[Sample] = [s for f in families for s in f.samples]
        self.families = {f.name: f.type for f in families}

    def value(self, name: str, **labels: str) -> float:
        """The value of the one sample called ``name`` whose labels are exactly ``labels``.

        Raises:
            AssertionError: no such sample, or more than one.
        """
        found = [s.value for s in self.samples if s.name == name and s.labels == labels]
        assert len(found) == 1, f"{name}{labels}: {len(found)} samples"
        return found[0]

    def by_label(self, name: str, label: str) -> dict[str, float]:
        """``{value of label: sample value}`` over the samples called ``name``."""
        return {s.labels[label]: s.value for s in self.samples if s.name == name}

    def label_names(self, name: str) -> set[str]:
        """Every label name the samples called ``name`` carry."""
        return {label for s in self.samples if s.name == name for label in s.labels}
