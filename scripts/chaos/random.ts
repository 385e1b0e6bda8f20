/**
 * A small seeded random source for the soak: the same seed gives the same job mix, the same fault
 * schedule and the same sequence of target choices. Independent streams (`fork`) keep the job mix
 * from shifting when the fault schedule changes, and the other way round.
 */

/** 32-bit FNV-1a over the text, then mixed: a seed for one stream. */
function hashSeed(text: string): number {
  let hash = 0x811c9dc5;
  for (let index = 0; index < text.length; index += 1) {
    hash ^= text.charCodeAt(index);
    hash = Math.imul(hash, 0x01000193) >>> 0;
  }
  return mix(hash);
}

function mix(value: number): number {
  let x = value >>> 0;
  x = Math.imul(x ^ (x >>> 16), 0x7feb352d) >>> 0;
  x = Math.imul(x ^ (x >>> 15), 0x846ca68b) >>> 0;
  return (x ^ (x >>> 16)) >>> 0;
}

export class Rng {
  private state: number;

  constructor(private readonly label: string) {
    this.state = hashSeed(label);
  }

  /** A uniform number in [0, 1). */
  next(): number {
    // A Weyl sequence through the mixer: simple, full period, good enough for test planning.
    this.state = (this.state + 0x9e3779b9) >>> 0;
    return mix(this.state) / 0x1_0000_0000;
  }

  /** An integer in [min, max], both included. */
  int(min: number, max: number): number {
    return min + Math.floor(this.next() * (max - min + 1));
  }

  /** A number in [min, max). */
  between(min: number, max: number): number {
    return min + this.next() * (max - min);
  }

  chance(probability: number): boolean {
    return this.next() < probability;
  }

  pick<T>(items: readonly T[]): T {
    if (items.length === 0) throw new Error('Rng.pick: nothing to pick from');
    return items[Math.floor(this.next() * items.length)] as T;
  }

  /** One of `choices`, each with its weight. */
  weighted<T>(choices: readonly (readonly [T, number])[]): T {
    const total = choices.reduce((sum, [, weight]) => sum + weight, 0);
    let point = this.next() * total;
    for (const [value, weight] of choices) {
      point -= weight;
      if (point < 0) return value;
    }
    const last = choices.at(-1);
    if (!last) throw new Error('Rng.weighted: no choices');
    return last[0];
  }

  /** An exponentially distributed wait with the given mean: the gaps of a Poisson process. */
  exponential(mean: number): number {
    return -Math.log(1 - this.next()) * mean;
  }

  /** An independent stream named after this one. */
  fork(name: string): Rng {
    return new Rng(`${this.label}/${name}`);
  }
}
