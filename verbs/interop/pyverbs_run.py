#!/usr/bin/env python3
# Runs rdma-core's own Python test suite (Debian's python3-pyverbs; the tests ship, gzipped,
# in /usr/share/doc/rdma-core/tests) against srdma0, as its run_tests.py does, with two
# additions for a test that must be able to fail:
#   --exclude PREFIX=REASON   leaves out the tests whose id starts with PREFIX (a feature
#                             another branch delivers), listed with REASON in the summary;
#   a summary: counts of ok / fail / error / skipped / excluded, and the skipped tests grouped
#                             by their skip reason (docs/verbs.md keeps that table), and the
#                             slowest tests of at least SLOW_S seconds.
# Exit status 0 when every test that ran passed, 1 otherwise (a failure, an error, or no
# test ran at all), 2 for a usage error.
#
#   pyverbs_run.py [--tests DIR] [--exclude PREFIX=REASON ...] [--only PREFIX ...]
#                  -- --dev srdma0 --gid 0 [-v]
import argparse
import collections
import gzip
import os
import shutil
import sys
import tempfile
import time
import unittest
from importlib.machinery import SourceFileLoader


def copy_tests(src, dst):
    """The suite as importable files: .py.gz files are decompressed."""
    for name in os.listdir(src):
        path = os.path.join(src, name)
        if name.endswith('.py.gz'):
            with gzip.open(path, 'rb') as f, open(os.path.join(dst, name[:-3]), 'wb') as out:
                shutil.copyfileobj(f, out)
        elif name.endswith('.py'):
            shutil.copy(path, os.path.join(dst, name))


def flatten(suite):
    for t in suite:
        if isinstance(t, unittest.TestSuite):
            yield from flatten(t)
        else:
            yield t


SLOW_S = 3.0  # a test at least this long is listed in the summary (most take under 1 s)


class TimedResult(unittest.TextTestResult):
    """Records each test's wall time (s), for the summary's slowest tests: a stall that ends
    short of the suite's bounds (an RDMA-CM message resent after its ~5 s response timeout)
    shows there."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.durations = []
        self._t0 = 0.0

    def startTest(self, test):
        self._t0 = time.monotonic()
        super().startTest(test)

    def stopTest(self, test):
        self.durations.append((time.monotonic() - self._t0, test.id()))
        super().stopTest(test)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument('--tests', default='/usr/share/doc/rdma-core/tests',
                    help='the suite (default: python3-pyverbs\' copy)')
    ap.add_argument('--exclude', action='append', default=[], metavar='PREFIX=REASON',
                    help='leave out tests whose id starts with PREFIX')
    ap.add_argument('--only', action='append', default=[], metavar='PREFIX',
                    help='run only the tests whose id starts with PREFIX')
    ap.add_argument('suite_args', nargs=argparse.REMAINDER,
                    help='arguments for the suite (after --): --dev srdma0 --gid 0 …')
    args = ap.parse_args()
    excludes = []
    for e in args.exclude:
        prefix, sep, reason = e.partition('=')
        if not sep or not prefix:
            ap.error(f'--exclude {e!r}: expected PREFIX=REASON')
        excludes.append((prefix, reason))
    if not os.path.isfile(os.path.join(args.tests, 'run_tests.py')):
        print(f'FAIL: no pyverbs test suite in {args.tests} (install python3-pyverbs)',
              file=sys.stderr)
        return 1

    work = tempfile.mkdtemp(prefix='softrdma-pyverbs-')
    try:
        testdir = os.path.join(work, 'tests')
        os.mkdir(testdir)
        copy_tests(args.tests, testdir)
        sys.path.insert(0, testdir)
        from args_parser import parser  # the suite's own option parser (--dev, --gid, …)
        rest = [a for a in args.suite_args if a != '--']
        sys.argv = [sys.argv[0]] + rest
        parser.parse_args()
        verbosity = 2 if parser.get_config().get('verbosity') else 1
        tests = SourceFileLoader('tests', os.path.join(testdir, '__init__.py')).load_module()
        everything = list(flatten(unittest.TestLoader().loadTestsFromModule(tests)))
        kept, left_out = [], collections.defaultdict(list)
        if args.only:
            everything = [t for t in everything if any(t.id().startswith(p) for p in args.only)]
        for t in everything:
            reason = next((r for p, r in excludes if t.id().startswith(p)), None)
            if reason is None:
                kept.append(t)
            else:
                left_out[reason].append(t.id())
        result = unittest.TextTestRunner(verbosity=verbosity, resultclass=TimedResult).run(
            unittest.TestSuite(kept))
    finally:
        shutil.rmtree(work, ignore_errors=True)

    skipped = collections.defaultdict(list)
    for test, reason in result.skipped:
        skipped[reason].append(test.id())
    failed = len(result.failures) + len(result.errors) + len(result.unexpectedSuccesses)
    ok = result.testsRun - failed - len(result.skipped) - len(result.expectedFailures)
    print(f'\npyverbs summary: {result.testsRun} run, {ok} ok, {len(result.failures)} failed, '
          f'{len(result.errors)} errors, {len(result.skipped)} skipped, '
          f'{sum(len(v) for v in left_out.values())} excluded')
    for reason, ids in sorted(skipped.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        print(f'  skipped {len(ids):3}  {reason}')
    for reason, ids in left_out.items():
        print(f'  excluded {len(ids):2}  {reason}')
    slow = sorted((d for d in result.durations if d[0] >= SLOW_S), reverse=True)
    for seconds, test_id in slow[:5]:
        print(f'  slow {seconds:6.1f} s  {test_id}')
    if verbosity > 1:
        for reason, ids in sorted(skipped.items()):
            print(f'\n{reason}:')
            for i in ids:
                print(f'    {i}')
    if result.testsRun == 0:
        print('FAIL: no test ran', file=sys.stderr)
        return 1
    return 0 if result.wasSuccessful() else 1


if __name__ == '__main__':
    sys.exit(main())
