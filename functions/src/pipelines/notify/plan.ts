/**
 * The notify plan: the validated artifact the planning step produces, one entry per message, with
 * the two effects each one needs (send the message, then log it to the customer's record) and
 * their keys. Everything here is deterministic: planning twice gives the same plan and the same
 * keys, and the keys depend on who the message is for, not on its wording.
 */
import { z } from 'zod';
import { deriveEffectKey, effectKeySchema, type EffectIntent } from '../../api';

export const MAX_RECIPIENTS = 500;
export const DEFAULT_TEMPLATE = 'Hi {name}, this is a reminder about {campaign}.';
export const DEFAULT_SUBJECT = '{campaign}: a reminder for {name}';

export const recipientSchema = z.strictObject({
  id: z.string().regex(/^[A-Za-z0-9_-]{1,64}$/, 'recipient id must be 1-64 letters, digits, - or _'),
  name: z.string().trim().min(1).max(80),
  address: z.string().trim().min(3).max(200),
});
export type Recipient = z.infer<typeof recipientSchema>;

export const notifyInput = z.strictObject({
  campaign: z.string().trim().min(1).max(80),
  /** How many generated customers to write to, or the recipients themselves. */
  recipients: z.union([
    z.number().int().min(1).max(MAX_RECIPIENTS),
    z
      .array(recipientSchema)
      .min(1)
      .max(MAX_RECIPIENTS)
      .refine((list) => new Set(list.map((recipient) => recipient.id)).size === list.length, 'recipient ids must be unique'),
  ]),
  /** Message body; {name}, {campaign}, {id} and {address} are filled in per recipient. */
  template: z.string().trim().min(1).max(400).default(DEFAULT_TEMPLATE),
  subject: z.string().trim().min(1).max(120).default(DEFAULT_SUBJECT),
});
export type NotifyInput = z.output<typeof notifyInput>;

export const plannedMessageSchema = z.strictObject({
  recipient: recipientSchema,
  subject: z.string().min(1),
  body: z.string().min(1),
  /** Key of the effect that sends the message. */
  sendKey: effectKeySchema,
  /** Key of the effect that logs it to the customer's record, applied after the send. */
  recordKey: effectKeySchema,
});
export type PlannedMessage = z.infer<typeof plannedMessageSchema>;

export const notifyPlanSchema = z
  .strictObject({ campaign: z.string().min(1), messages: z.array(plannedMessageSchema).min(1).max(MAX_RECIPIENTS) })
  .refine((plan) => new Set(plan.messages.map((message) => message.recipient.id)).size === plan.messages.length, 'each recipient appears once');
export type NotifyPlan = z.infer<typeof notifyPlanSchema>;

export function recipientsOf(input: NotifyInput): Recipient[] {
  if (typeof input.recipients !== 'number') return input.recipients;
  return Array.from({ length: input.recipients }, (_, index) => {
    const number = String(index + 1).padStart(3, '0');
    return { id: `c${number}`, name: `Customer ${number}`, address: `customer-${number}@example.test` };
  });
}

/** Fills {name}, {campaign}, {id} and {address}; any other braces are left as written. */
export function render(template: string, campaign: string, recipient: Recipient): string {
  const values: Record<string, string> = { name: recipient.name, campaign, id: recipient.id, address: recipient.address };
  return template.replace(/\{(name|campaign|id|address)\}/g, (_, field: string) => values[field] ?? '');
}

const identityOf = (campaign: string, recipient: Recipient) => `${campaign}/${recipient.id}`;

export function sendIntent(campaign: string, message: Pick<PlannedMessage, 'recipient' | 'subject' | 'body'>): EffectIntent {
  return {
    kind: 'message',
    identity: identityOf(campaign, message.recipient),
    target: message.recipient.address,
    payload: { campaign, recipientId: message.recipient.id, recipientName: message.recipient.name, subject: message.subject, body: message.body },
  };
}

export function recordIntent(campaign: string, message: Pick<PlannedMessage, 'recipient' | 'subject' | 'sendKey'>): EffectIntent {
  return {
    kind: 'record',
    identity: identityOf(campaign, message.recipient),
    target: `customers/${message.recipient.id}`,
    payload: { campaign, entry: `Reminder sent: "${message.subject}"`, messageKey: message.sendKey },
  };
}

/** The planning step: a deterministic template, so the artifact is the same however often it runs. */
export function buildPlan(jobId: string, input: NotifyInput): NotifyPlan {
  const messages = recipientsOf(input).map((recipient) => {
    const subject = render(input.subject, input.campaign, recipient);
    const body = render(input.template, input.campaign, recipient);
    const sendKey = deriveEffectKey(jobId, null, sendIntent(input.campaign, { recipient, subject, body }));
    const recordKey = deriveEffectKey(jobId, null, recordIntent(input.campaign, { recipient, subject, sendKey }));
    return { recipient, subject, body, sendKey, recordKey };
  });
  return notifyPlanSchema.parse({ campaign: input.campaign, messages });
}
