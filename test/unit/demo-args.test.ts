/** `npm run demo`'s arguments: `--web` is an option, never a question; anything unknown that looks like one is refused. */
import { DemoUsageError, parseDemoArguments } from '../../scripts/lib/demo-args';

test.each([
  [[], { web: false, help: false, question: null }],
  [['How', 'do', 'leases', 'work?'], { web: false, help: false, question: 'How do leases work?' }],
  [['--web'], { web: true, help: false, question: null }],
  [['--web', 'How do leases work?'], { web: true, help: false, question: 'How do leases work?' }],
  [['How do leases work?', '--web'], { web: true, help: false, question: 'How do leases work?' }],
  [['--', '--web', 'is', 'a', 'flag?'], { web: false, help: false, question: '--web is a flag?' }],
  [['--web', '--', '-1 is less than 0?'], { web: true, help: false, question: '-1 is less than 0?' }],
  [['--help'], { web: false, help: true, question: null }],
  [['  '], { web: false, help: false, question: null }],
])('%j → %j', (args, expected) => {
  expect(parseDemoArguments(args)).toEqual(expected);
});

test('an unknown option is refused, not asked as a question', () => {
  expect(() => parseDemoArguments(['--wbe'])).toThrow(DemoUsageError);
  expect(() => parseDemoArguments(['What', 'is', '-x'])).toThrow(/Unknown option -x/);
});
