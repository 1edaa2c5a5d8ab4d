import { defineConfig } from 'tsup';
import { packageBuild } from '../../tsup.base';

// Browsers as well as Node: no Node built-ins to resolve, and syntax every current browser runs.
export default defineConfig({ ...packageBuild, platform: 'neutral', target: 'es2022' });
