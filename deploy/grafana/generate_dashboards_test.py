#!/usr/bin/env python3
"""The committed dashboards are what the generator makes, and it refuses unexported metrics."""

import json
import os
import pathlib
import sys
import tempfile
import unittest

# Under Bazel the test runs from a copy outside its runfiles; the generator lives in them.
HERE = (pathlib.Path(os.environ["TEST_SRCDIR"], os.environ["TEST_WORKSPACE"], "deploy/grafana")
        if "TEST_SRCDIR" in os.environ else pathlib.Path(__file__).parent)
sys.path.insert(0, str(HERE))
import generate_dashboards as generator  # noqa: E402


def with_query(expr):
    """The generated files plus one dashboard whose single panel runs `expr`."""
    files = generator.generate()
    files["extra.json"] = json.dumps({"panels": [{"title": "extra", "targets": [{"expr": expr}]}]})
    return files


class GeneratedDashboardsTest(unittest.TestCase):
    def test_the_committed_dashboards_are_what_the_generator_writes(self):
        committed = generator.ROOT / generator.OUTPUT_DIR
        self.assertEqual(generator.drift(generator.generate(), committed), [])

    def test_every_panel_queries_exported_metrics_or_recording_rules(self):
        self.assertEqual(generator.unknown_metrics(generator.generate(), generator.ROOT), [])

    def test_each_dashboard_has_panels_with_unique_ids_and_queries(self):
        for name, text in generator.generate().items():
            panels = json.loads(text)["panels"]
            self.assertGreater(len(panels), 5, name)
            self.assertEqual(len({panel["id"] for panel in panels}), len(panels), name)
            for panel in panels:
                self.assertTrue(panel["targets"], f"{name}: {panel['title']}")


class UnknownMetricsTest(unittest.TestCase):
    def test_a_metric_nobody_exports_is_refused(self):
        problems = generator.unknown_metrics(
            with_query("rate(tandem_rollout_tokens_total[5m])"), generator.ROOT)
        self.assertEqual(len(problems), 1)
        self.assertIn("tandem_rollout_tokens_total", problems[0])

    def test_histogram_series_exist_only_for_histograms(self):
        root = generator.ROOT
        self.assertFalse(generator.unknown_metrics(
            with_query("tandem_rollout_decode_step_seconds_bucket"), root))
        self.assertTrue(generator.unknown_metrics(
            with_query("tandem_rollout_tokens_generated_total_bucket"), root))
        self.assertTrue(generator.unknown_metrics(with_query("tandem_trainer_step_count"), root))

    def test_step_metrics_fields_and_recording_rules_are_known(self):
        for expr in ("tandem_trainer_swap_seconds", "tandem:refit_seconds", "up"):
            self.assertFalse(generator.unknown_metrics(with_query(expr), generator.ROOT), expr)

    def test_label_names_and_values_are_not_metrics(self):
        self.assertEqual(
            generator.metrics_in('sum by (tandem_label) (tandem_a{job=~"tandem_b"}) / on() '
                                 'rate(tandem:c[5m])'),
            {"tandem_a", "tandem:c"})


class DriftTest(unittest.TestCase):
    def test_an_edited_missing_or_extra_file_is_drift(self):
        files = generator.generate()
        with tempfile.TemporaryDirectory() as directory:
            out = pathlib.Path(directory)
            for name, text in files.items():
                (out / name).write_text(text)
            self.assertEqual(generator.drift(files, out), [])
            edited, removed = sorted(files)[:2]
            (out / edited).write_text(files[edited].replace("Tandem", "Tandme"))
            (out / removed).unlink()
            (out / "hand-made.json").write_text("{}")
            self.assertEqual(len(generator.drift(files, out)), 3)


if __name__ == "__main__":
    unittest.main()
