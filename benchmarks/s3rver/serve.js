'use strict';
// s3rver for benchmarks/objectstore.py: `node serve.js PORT DIRECTORY BUCKET`.
//
// s3rver keeps objects as plain files and streams ranged GETs from them, so unlike moto a
// range costs what it transfers. It ignores If-Match on GET and HEAD, which S3 answers with
// 412 when the ETag differs; the middleware below adds that, so pinned ranged loads behave as
// they would on S3.
const S3rver = require('s3rver');

const [port, directory, bucket] = process.argv.slice(2);

const server = new S3rver({
  address: '127.0.0.1',
  port: Number(port),
  directory,
  silent: true,
  allowMismatchedSignatures: true,
  configureBuckets: [{ name: bucket }],
});

function unquote(tag) {
  return String(tag).replace(/"/g, '').trim();
}

server.middleware.unshift(async (ctx, next) => {
  const wanted = ctx.headers['if-match'];
  if (!wanted || (ctx.method !== 'GET' && ctx.method !== 'HEAD')) return next();
  const [, name, ...rest] = ctx.path.split('/');
  if (!name || rest.length === 0) return next();
  const key = decodeURIComponent(rest.join('/'));
  let metadata;
  try {
    metadata = await server.store.getMetadata(name, key);
  } catch (err) {
    return next(); // no such object: s3rver answers NoSuchKey itself
  }
  const tags = wanted.split(',').map(unquote);
  if (tags.includes('*') || tags.includes(unquote(metadata.etag))) return next();
  ctx.status = 412;
  ctx.type = 'application/xml';
  ctx.body =
    '<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>PreconditionFailed</Code>' +
    '<Message>At least one of the pre-conditions you specified did not hold</Message>' +
    '<Condition>If-Match</Condition></Error>';
  return undefined;
});

server.run((err) => {
  if (err) {
    console.error(err);
    process.exit(1);
  }
  console.log(`listening on 127.0.0.1:${port}`);
});

for (const signal of ['SIGTERM', 'SIGINT']) {
  process.on(signal, () => server.close(() => process.exit(0)));
}
